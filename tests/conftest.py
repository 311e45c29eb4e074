"""Session-wide test set-up: offline litellm/tiktoken before anything imports them."""

from proxy.process.offline import prepare_offline_environment

prepare_offline_environment()

# Property tests draw the same examples on every run: CI must not pass or fail by the luck of the draw
# (a failure found once is kept as an explicit example in the test that found it).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("deterministic", derandomize=True, database=None)
_hypothesis_settings.load_profile("deterministic")
