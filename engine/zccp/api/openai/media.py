"""An image part as OpenAI checks it (zccp.api.media's rules): Chat Completions'
`image_url.url` and Responses' `image_url`, an http(s) URL (not fetched: the model sees a
marker) or a base64 data URL of an image type it takes, within its size."""

from __future__ import annotations

from typing import Any

from ..media import OPENAI_IMAGES, split_data_url
from .wording import OpenAIApiError, _err, _missing, _obj, _str


def _invalid(param: str, why: str, code: str = "invalid_image_url") -> OpenAIApiError:
    return _err(f"Invalid image URL: '{param}'. {why}", param, code)


def check_image_url(url: str, param: str) -> None:
    """Raise OpenAI's 400 for an image URL the real API refuses."""
    if url.startswith(("https://", "http://")):
        return
    parts = split_data_url(url)
    if parts is None:
        raise _invalid(param, "Expected an http(s) URL or a base64-encoded data URL with an image MIME type "
                              "(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU=').")
    media_type, is_base64, data = parts
    problem = OPENAI_IMAGES.media_type_problem(media_type)
    if problem is not None:
        raise _invalid(param, problem[0].upper() + problem[1:] + ".", "invalid_image_format")
    if not is_base64:
        raise _invalid(param, "Expected a base64-encoded data URL (';base64,').")
    problem = OPENAI_IMAGES.data_problem(data)
    if problem is not None:
        raise _invalid(param, problem[0].upper() + problem[1:] + ".",
                       "image_too_large" if problem.startswith("image exceeds") else "invalid_image_url")


def check_image_part(part: dict[str, Any], path: str) -> None:
    """A Chat Completions `image_url` content part."""
    param = path + ".image_url"
    if "image_url" not in part:
        raise _missing(param)
    image = _obj(part["image_url"], param)
    if "url" not in image:
        raise _missing(param + ".url")
    url = _str(image["url"], param + ".url")
    if url:   # empty: a Responses image given by file_id, read as this part (zccp.api.responses)
        check_image_url(url, param + ".url")
