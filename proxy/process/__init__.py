"""Process upkeep: serving and draining, memory (heap trims, collections), thread priority, the offline set-up."""
