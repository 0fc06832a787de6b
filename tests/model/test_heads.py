"""Head names (``plateauscope.model.heads``): one spelling everywhere, read back both ways."""

import pytest

from plateauscope.model.heads import head_label, parse_head_label


def test_a_label_reads_back_to_its_head():
    for layer, head in [(0, 0), (3, 2), (11, 15)]:
        assert head_label(layer, head) == f"L{layer}H{head}"
        assert parse_head_label(head_label(layer, head), 12, 16) == (layer, head)
    assert parse_head_label("0.3", 4, 4) == (0, 3) and parse_head_label(" l1h2 ", 4, 4) == (1, 2)


@pytest.mark.parametrize("text, message", [("L9H0", "does not exist"), ("H1", "write heads as"), ("L1x2", "write heads as")])
def test_a_bad_label_is_one_line(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_head_label(text, 2, 4)
    assert "\n" not in str(err.value)
