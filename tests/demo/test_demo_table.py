"""``mmcse demo``'s table says what its numbers can and cannot mean (one seed, random teacher)."""

from __future__ import annotations

from mmcse.demo.run import comparison_markdown


def test_the_demo_table_says_what_its_numbers_cannot_mean():
    results = {"simcse": {"shapes": 40.0, "avg": 40.0}, "mcse": {"shapes": 62.0, "avg": 62.0}}
    curves = {"simcse": [(10, 30.0), (20, 31.0)], "mcse": [(10, 40.0), (20, 55.0)]}
    table = comparison_markdown(results, curves, steps=300)
    note = table.split("| mcse |")[1]  # said under the numbers, not before them only
    assert "300 steps" in note and "1 seed: not compared" in note
    assert "random weights" in note and "not evidence that MCSE beats SimCSE" in note


def test_the_demo_replaces_only_an_earlier_demo_and_says_so(tmp_path, caplog):
    """It overwrote any folder silently."""
    import logging

    import pytest

    from mmcse.demo.run import check_demo_folder
    from mmcse.errors import MmcseError

    check_demo_folder(tmp_path / "new")  # new or empty: nothing to say
    demo = tmp_path / "demo"
    (demo / "simcse").mkdir(parents=True)
    (demo / "comparison.md").write_text("| earlier |")
    with caplog.at_level(logging.WARNING, logger="mmcse.demo.run"):
        check_demo_folder(demo)
    assert f"{demo} holds an earlier demo: replacing it" in caplog.text
    (demo / "thesis.tex").write_text("mine")
    with pytest.raises(MmcseError, match=r"holds thesis.tex, which no demo wrote"):
        check_demo_folder(demo)
