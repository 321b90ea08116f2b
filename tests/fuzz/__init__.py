"""Fuzzing of every parser that reads client input (issue 9, "hostile input").

``targets.py`` holds the targets as plain functions of ``bytes`` plus their seed corpora;
``test_fuzz_inprocess.py`` drives them with hypothesis, ``test_fuzz_broker.py`` sends hostile
requests to a real broker. ``QUEEN_FUZZ_EXAMPLES`` sets the number of examples per test (small
by default, so that ``make test`` stays quick; ``make fuzz`` runs the long version).
"""
