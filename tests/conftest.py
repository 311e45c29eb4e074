"""Session-wide test set-up: offline litellm/tiktoken before anything imports them."""

from proxy.offline import prepare_offline_environment

prepare_offline_environment()
