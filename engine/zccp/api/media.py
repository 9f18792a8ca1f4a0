"""The image rules the real APIs apply before a model sees anything, applied here too:
base64 that decodes, a media type the API takes, an image within its size. The model
sees an image only as a marker; these rules are what a client must get the same 400 for.

Decoding is binascii's, in C (strict: no characters outside the alphabet, padding where
it belongs), of data the body's size limit already bounds.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass
from typing import Final

__all__ = ["ImageRules", "ANTHROPIC_IMAGES", "OPENAI_IMAGES", "decoded_size", "split_data_url"]


@dataclass(frozen=True)
class ImageRules:
    """What one API accepts as an image."""

    media_types: tuple[str, ...]
    max_bytes: int               # decoded, per image

    def media_type_problem(self, media_type: str) -> str | None:
        if media_type.lower() in self.media_types:
            return None
        return "unsupported image media type " + repr(media_type) + "; supported: " + ", ".join(self.media_types)

    def data_problem(self, data: str) -> str | None:
        size = decoded_size(data)
        if size is None:
            return "image data is not valid base64"
        if size > self.max_bytes:
            return f"image exceeds {self.max_bytes // (1024 * 1024)} MB maximum: {size} bytes > {self.max_bytes} bytes"
        return None


# The Messages API: these four, 5 MB per image.
ANTHROPIC_IMAGES: Final = ImageRules(("image/jpeg", "image/png", "image/gif", "image/webp"), 5 * 1024 * 1024)
# OpenAI's vision inputs: PNG, JPEG (.jpeg and .jpg), WEBP, non-animated GIF; 20 MB per image.
OPENAI_IMAGES: Final = ImageRules(("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"),
                                  20 * 1024 * 1024)


def decoded_size(data: str) -> int | None:
    """The size of base64 `data` decoded, or None when it is not base64."""
    try:
        return len(binascii.a2b_base64(data, strict_mode=True))
    except (binascii.Error, ValueError):
        return None


_DATA_URL: Final = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),", re.IGNORECASE)


def split_data_url(url: str) -> tuple[str, bool, str] | None:
    """A data: URL's (media type, base64?, data), or None when `url` is not a data URL."""
    m = _DATA_URL.match(url)
    if m is None:
        return None
    params = [p.strip().lower() for p in m.group(2).split(";")]
    return m.group(1).strip(), "base64" in params, url[m.end():]
