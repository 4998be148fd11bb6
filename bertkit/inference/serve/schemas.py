"""The request bodies, validated by pydantic: strict types, UTF-8 text, failing fast."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator
from pydantic_core import PydanticCustomError

from ...inputs import lone_surrogate

# a list's validation stops at its first bad item: a 1 MB body of 500,000 wrong items held the
# event loop 10 s for pydantic's 500,000 errors and a 50 MB answer
FAIL_FAST = Field(fail_fast=True)


def _not_utf8(value, at: str = "", depth: int = 0) -> str | None:
    """Where in a field's value (a string, or a list of strings or of objects) a string UTF-8
    cannot encode is ("" for the value itself), or None. JSON's "\\ud800" escape decodes to such a
    lone surrogate: the tokenizer and the JSON answer both refuse it."""
    if isinstance(value, str):
        return at if lone_surrogate(value) else None
    if isinstance(value, (list, dict)) and depth < 2:  # nothing deeper than a list of objects is read as text
        for k, v in (value.items() if isinstance(value, dict) else enumerate(value)):
            found = _not_utf8(v, f"{at}[{k}]" if isinstance(k, int) else f"{at}.{k}", depth + 1)
            if found is not None:
                return found
    return None


class Body(BaseModel):
    """Every request body: its strings must be UTF-8 text, a 422 naming the field otherwise."""

    @field_validator("*")
    @classmethod
    def utf8(cls, value):
        at = _not_utf8(value)
        if at is not None:
            raise PydanticCustomError("string_not_utf8", "{at}not valid UTF-8 (it holds an unpaired surrogate, "
                                      "a \\ud800-\\udfff escape)", {"at": f"{at} is " if at else ""})
        return value


class Strict(Body):
    model_config = ConfigDict(extra="forbid")


# booleans and integers strict: pydantic would take "yes" for true and true for 1
class EncodeRequest(Strict):
    texts: list[str] = Field(min_length=1, fail_fast=True, description="texts to encode")
    text_pairs: list[str] | None = Field(None, fail_fast=True, description="second texts: each vector is of the pair")
    pooling: Literal["cls", "mean", "pooler"] | None = Field(None, description="default: the folder's")
    normalize: StrictBool | None = Field(None, description="unit length; default: the folder's (true where a "
                                                          "sentence-transformers folder ends with Normalize)")


class EmbeddingsRequest(Body):  # OpenAI's fields; unknown ones are ignored, as clients add their own
    input: Union[str, Annotated[list[str], FAIL_FAST], Annotated[list[int], FAIL_FAST],
                 Annotated[list[list[int]], FAIL_FAST]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None


class FillMaskRequest(Strict):
    text: str | None = Field(None, description="a text with one or more [MASK]: answered as "
                                               '{"predictions": [[{"token", "score"}, ...] per [MASK]]}')
    texts: list[str] | None = Field(None, min_length=1, fail_fast=True, description="several texts: answered as "
                                                                    '{"results": [{"text", "masks"}, ...]}')
    top_k: StrictInt = Field(5, ge=1)


class PredictRequest(Strict):
    inputs: list[Union[str, dict[str, Any]]] = Field(
        min_length=1, fail_fast=True, description="strings, or {text, text_pair} (classify), or {question, context} (qa)")
    top_k: int | None = Field(None, ge=1, description="word: words per input, best first (default 10)")


class AttentionRequest(Strict):
    text: str
    text_pair: str | None = None
