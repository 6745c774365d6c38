"""A served model's name and aliases from ``--model-name`` and ``--served-model-name`` (vLLM's
``--served-model-name`` doc: "If multiple model names provided, the server will respond to any of
the provided names. The model name in the model field of a response will be the first name")."""

from __future__ import annotations

import pytest

from dyn.core.model.names import MAX_NAMES, served_names


def test_the_first_served_name_is_the_name_and_the_others_are_aliases():
    assert served_names(None, ["a", "b", "c", "b"]) == ("a", ("b", "c"))
    assert served_names("a", ["a", "b"]) == ("a", ("b",))
    assert served_names("m", []) == ("m", ())
    assert served_names(None, []) == (None, ())


@pytest.mark.parametrize(
    ("model_name", "served", "says"),
    [
        ("x", ["a", "b"], "disagree"),
        (None, [""], "1 to 256 characters"),
        (None, [" a"], "whitespace"),
        ("a" * 300, [], "1 to 256 characters"),
        (None, [f"m{i}" for i in range(MAX_NAMES + 1)], f"at most {MAX_NAMES}"),
    ],
)
def test_bad_names_say_what_to_fix(model_name, served, says):
    with pytest.raises(ValueError, match=says):
        served_names(model_name, served)
