"""The operator's view of a rollout: a self-contained report page and the live inspector, from trace files.

``traces.py`` is the only module that reads trace keys; ``page.py`` and ``chart.py`` render what it
summarizes; ``inspector.py`` serves the same views from a running proxy's trace folder.
"""
