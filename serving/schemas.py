"""Request bodies of ``POST /predict`` and how their validation errors are worded.

Bodies are parsed with pydantic-core's JSON parser in one pass: NaN/Infinity and numbers that
overflow to infinity, strings or booleans where numbers belong, and unknown keys are refused with
the field's path in the message. A customer id is a string or an integer (its decimal text), as
``POST /events`` takes it, read as validation reads ids (``"13085.0"`` is ``13085``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from tasks.definitions.contract import customer_id_text

FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]
MAX_CUSTOMER_ID_CHARS = 256


def _customer_id_text(value: Any) -> str:
    """A customer id as the batch stages hold it (:func:`customer_id_text`: trimmed of spaces,
    ``"13085.0"`` as ``13085``), or an integer's decimal text (as validation casts an integer
    id column, and as ``POST /events`` takes ids); any other JSON type is refused."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a string or an integer")
    text = customer_id_text(value) if isinstance(value, str) else str(value)
    if not 1 <= len(text) <= MAX_CUSTOMER_ID_CHARS:
        raise ValueError(f"must have 1 to {MAX_CUSTOMER_ID_CHARS} characters")
    return text


CustomerId = Annotated[
    str,
    BeforeValidator(_customer_id_text),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1, "maxLength": MAX_CUSTOMER_ID_CHARS},
                {"type": "integer"},
            ]
        }
    ),
]


class PredictItem(BaseModel):
    """One thing to score: a known customer or raw feature values by name."""

    model_config = ConfigDict(extra="forbid")

    customer_id: CustomerId | None = None
    features: dict[str, FiniteNumber] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PredictItem:
        if (self.customer_id is None) == (self.features is None):
            raise ValueError("give exactly one of 'customer_id' or 'features'")
        return self


class PredictRequest(BaseModel):
    """A single item (``customer_id`` or ``features``) or a batch (``items``)."""

    model_config = ConfigDict(extra="forbid")

    customer_id: CustomerId | None = None
    features: dict[str, FiniteNumber] | None = None
    items: list[PredictItem] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PredictRequest:
        given = [f for f in ("customer_id", "features", "items") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'customer_id', 'features' or 'items'")
        if self.items is not None and not self.items:
            raise ValueError("'items' must not be empty")
        return self

    def as_items(self) -> list[PredictItem]:
        """The request as a list of items (one for the single form)."""
        if self.items is not None:
            return self.items
        return [PredictItem.model_construct(customer_id=self.customer_id, features=self.features)]


def field_path(loc: tuple[Any, ...]) -> str:
    """``('items', 3, 'features', 'x')`` -> ``items[3].features.x``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def describe_validation_error(exc: ValidationError) -> list[dict[str, str]]:
    """One ``{"field", "message"}`` per problem, in words a caller can act on."""
    problems = []
    for err in exc.errors(include_url=False):
        kind = err["type"]
        field = field_path(tuple(err["loc"]))
        message = err["msg"]
        if kind == "json_invalid":
            message = f"body is not valid JSON ({message.removeprefix('Invalid JSON: ')})"
        elif kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "finite_number":
            message = "must be a finite number (NaN and infinity are refused)"
        elif kind == "value_error":
            message = message.removeprefix("Value error, ")
        problems.append({"field": field, "message": message})
    return problems
