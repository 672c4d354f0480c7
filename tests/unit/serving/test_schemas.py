"""Request validation of POST /predict and the wording of its errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serving.schemas import PredictRequest, describe_validation_error, field_path


def _problems(body: bytes) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        PredictRequest.model_validate_json(body)
    return describe_validation_error(info.value)


def test_field_paths_read_like_the_json():
    assert field_path(("items", 3, "features", "x")) == "items[3].features.x"
    assert field_path(()) == "body"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b'{"features": {"a": NaN}}', "features.a", "finite"),
        (b'{"features": {"a": Infinity}}', "features.a", "finite"),
        (b'{"features": {"a": 1e999}}', "features.a", "finite"),
        (b'{"features": {"a": "1"}}', "features.a", "valid number"),
        (b'{"features": {"a": false}}', "features.a", "valid number"),
        (b'{"customer_id": 7.0}', "customer_id", "a string or an integer"),
        (b'{"customer_id": true}', "customer_id", "a string or an integer"),
        (b'{"customer_id": "  "}', "customer_id", "1 to 256 characters"),
        (b'{"items": [{"customer_id": null}]}', "items[0]", "exactly one"),
        (b'{"customer": "c1"}', "customer", "unknown field"),
        (b"{oops", "body", "not valid JSON"),
        (b'{"items": [{"customer_id": "a", "features": {}}]}', "items[0]", "exactly one"),
        (b'{"items": "c1"}', "items", "valid array"),
    ],
)
def test_bad_bodies_name_the_field(body, field, words):
    problems = _problems(body)
    assert problems[0]["field"] == field
    assert words in problems[0]["message"]


def test_single_and_batch_forms():
    single = PredictRequest.model_validate_json(b'{"features": {"a": 1, "b": 2.5}}')
    assert single.as_items()[0].features == {"a": 1.0, "b": 2.5}
    batch = PredictRequest.model_validate_json(
        b'{"items": [{"customer_id": "x"}, {"features": {}}]}'
    )
    assert [i.customer_id for i in batch.as_items()] == ["x", None]


def test_customer_ids_are_strings_or_integers_as_the_events_take_them():
    single = PredictRequest.model_validate_json(b'{"customer_id": 12346}')
    assert single.customer_id == "12346"
    batch = PredictRequest.model_validate_json(
        b'{"items": [{"customer_id": " c1 "}, {"customer_id": 7}]}'
    )
    assert [i.customer_id for i in batch.as_items()] == ["c1", "7"]
    # an id pandas wrote as a float reads as validation reads it: 13085.0 is 13085
    exported = PredictRequest.model_validate_json(b'{"customer_id": " 13085.0"}')
    assert exported.customer_id == "13085"
