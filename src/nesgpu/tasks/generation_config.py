"""A model directory's ``generation_config.json``, which ``from_pretrained`` validates as it loads the model: a
field transformers refuses there (``max_new_tokens: 0``) is named with the file, not blamed on the model."""

from __future__ import annotations

from pathlib import Path

GENERATION_CONFIG = "generation_config.json"


def generation_config_error(directory: Path) -> str | None:
    """Why transformers refuses ``directory``'s generation_config.json, naming the file (and, in transformers'
    words, the field); None where it has none or it is accepted."""
    import transformers

    path = Path(directory) / GENERATION_CONFIG
    if not path.is_file():
        return None
    try:
        transformers.GenerationConfig.from_pretrained(directory, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - its checks raise ValueError, TypeError, ...: each is the file's fault
        why = " ".join(str(e).split()) or type(e).__name__
        return f"{path} holds a generation setting transformers refuses ({why}); correct or remove that field"
    return None


__all__ = ["GENERATION_CONFIG", "generation_config_error"]
