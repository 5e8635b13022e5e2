"""The JSON files of an export (config.json, llm_config.json, tokenizer_config.json), checked."""

from __future__ import annotations

import json
from pathlib import Path


def load_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ValueError(f"{path}: missing ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({what}): {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object ({what})")
    return data

