"""Make litellm and tiktoken work without network access.

``import litellm`` fetches a price map from the internet unless told not to (and, on an Anthropic call,
a table of beta headers), and tiktoken downloads its encodings on first use. litellm ships the map and
the ``cl100k_base`` / ``o200k_base`` files, so pointing both at those copies lets the proxy start and
count tokens offline.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def litellm_tokenizer_dir() -> Path | None:
    """The folder where litellm keeps its bundled tiktoken encodings, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


def prepare_offline_environment() -> None:
    """Set the environment so litellm and tiktoken use local data; explicit settings win."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # Whatever else litellm would fetch on its own (Anthropic's beta-header table on an Anthropic call, and
    # any catalog it adds later): its bundled copy. The provider calls themselves go where routes say.
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
    os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    tokenizers = litellm_tokenizer_dir()
    if tokenizers is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(tokenizers))
