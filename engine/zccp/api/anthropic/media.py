"""An image content block as the Messages API checks it (zccp.api.media's rules): its
source's type, media_type and base64 data; each refusal names the field."""

from __future__ import annotations

from typing import Any, Final

from ..media import ANTHROPIC_IMAGES
from .wording import _bad, _dict, _required, _str

_SOURCES: Final = {"base64": "data", "url": "url", "file": "file_id"}   # source type -> its field


def check_image(block: dict[str, Any], path: str) -> None:
    """Raise the API's 400 for an image block the real API refuses."""
    spath = path + ".source"
    source = _dict(_required(block, "source", spath), spath)
    stype = _str(_required(source, "type", spath + ".type"), spath + ".type")
    if stype not in _SOURCES:
        raise _bad(spath + ".type", "Input should be 'base64', 'url' or 'file'")
    value = _str(_required(source, _SOURCES[stype], f"{spath}.{_SOURCES[stype]}"), f"{spath}.{_SOURCES[stype]}")
    if stype != "base64":
        return
    media_type = _str(_required(source, "media_type", spath + ".media_type"), spath + ".media_type")
    problem = ANTHROPIC_IMAGES.media_type_problem(media_type)
    if problem is not None:
        raise _bad(spath + ".media_type", "Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'")
    problem = ANTHROPIC_IMAGES.data_problem(value)
    if problem is not None:
        raise _bad(spath + ".data", problem)
