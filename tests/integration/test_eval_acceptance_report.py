"""serve.evaluate's printed line: positions no round reached are not shown as 0."""

from serve.evaluate import shown_conditional


def test_unreached_positions_show_a_dash_not_a_rejection():
    row = {"conditional_acceptance": [0.5, 0.0, 0.0], "reached_per_pos": [8, 4, 0]}
    # Position 1 was reached and rejected every time (0.00); position 2 never reached (-).
    assert shown_conditional(row) == "0.50 0.00 -"
