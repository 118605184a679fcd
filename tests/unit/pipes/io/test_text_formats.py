"""CSV, JSON and JSON-lines files, and paragraphs of lines: torchdata's outputs, errors
that name the file, resume inside a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.pipes import (
    CSVDictParser,
    CSVParser,
    FileLister,
    FileOpener,
    IterableWrapper,
    JsonLinesParser,
    JsonParser,
    ParagraphAggregator,
)
from resume_checks import check_resume_at_every_cut

pytestmark = pytest.mark.timeout(120)


def opened(*paths: Path, mode: str = "b") -> Any:
    return FileOpener(IterableWrapper([str(p) for p in paths]), mode=mode)


def test_parse_csv_yields_rows_as_lists_or_tuples(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("key,item\na,1\nb,2\n")
    pipe = opened(tmp_path / "a.csv").parse_csv()
    assert isinstance(pipe, CSVParser) and list(pipe) == [["key", "item"], ["a", "1"], ["b", "2"]]
    assert list(opened(tmp_path / "a.csv").parse_csv(skip_lines=1, as_tuple=True)) == [("a", "1"), ("b", "2")]
    with_path = list(opened(tmp_path / "a.csv", mode="r").parse_csv(skip_lines=2, return_path=True))
    assert with_path == [(str(tmp_path / "a.csv"), ["b", "2"])]
    (tmp_path / "b.tsv").write_text("x\ty\n")
    assert list(opened(tmp_path / "b.tsv").parse_csv(delimiter="\t")) == [["x", "y"]]


def test_parse_csv_as_dict_keys_rows_by_the_header(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("key,item\na,1\nb,2\n")
    pipe = opened(tmp_path / "a.csv").parse_csv_as_dict()
    assert isinstance(pipe, CSVDictParser)
    assert list(pipe) == [{"key": "a", "item": "1"}, {"key": "b", "item": "2"}]


def test_parse_json_files_and_json_lines(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"x": [1, 2]}))
    pipe = opened(tmp_path / "a.json").parse_json_files()
    assert isinstance(pipe, JsonParser) and list(pipe) == [(str(tmp_path / "a.json"), {"x": [1, 2]})]
    (tmp_path / "a.jsonl").write_text('{"i": 1}\n\n{"i": 2}\n')
    lines = opened(tmp_path / "a.jsonl").parse_jsonl_files(return_path=False)
    assert isinstance(lines, JsonLinesParser) and list(lines) == [{"i": 1}, {"i": 2}]


def test_what_is_not_json_is_an_error_naming_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "bad.jsonl").write_text('{"i": 1}\nnope\n')
    with pytest.raises(ValueError, match=r"bad\.json' is not JSON"):
        list(opened(tmp_path / "bad.json").parse_json_files())
    with pytest.raises(ValueError, match=r"line 2 of .*bad\.jsonl"):
        list(opened(tmp_path / "bad.jsonl").parse_jsonl_files())


def test_lines_to_paragraphs_joins_runs_of_lines_per_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n\nthree\n\n\nfour\n")
    (tmp_path / "b.txt").write_text("five\nsix")
    pipe = opened(tmp_path / "a.txt", tmp_path / "b.txt", mode="r").readlines().lines_to_paragraphs()
    assert isinstance(pipe, ParagraphAggregator)
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    assert list(pipe) == [(a, "one\ntwo"), (a, "three"), (a, "four"), (b, "five\nsix")]
    joined = opened(tmp_path / "b.txt", mode="r").readlines().lines_to_paragraphs(joiner=" | ".join)
    assert list(joined) == [(b, "five | six")]


def files(root: Path) -> Path:
    for k in range(3):
        (root / f"f{k}.csv").write_text("".join(f"{k},{i}\n" for i in range(4)))
        (root / f"f{k}.jsonl").write_text("".join(json.dumps({"k": k, "i": i}) + "\n" for i in range(3)))
        (root / f"f{k}.txt").write_text(f"a{k}\nb{k}\n\nc{k}\n\n\nd{k}\ne{k}\n")
    return root


@pytest.mark.parametrize("kind", ["csv", "jsonl", "paragraphs"])
def test_they_resume_at_every_cut(tmp_path: Path, kind: str) -> None:
    root = str(files(tmp_path))

    def make() -> Any:
        if kind == "csv":
            return FileOpener(FileLister(root, "*.csv"), mode="b").parse_csv(as_tuple=True)
        if kind == "jsonl":
            return FileOpener(FileLister(root, "*.jsonl"), mode="b").parse_jsonl_files(return_path=False)
        return FileOpener(FileLister(root, "*.txt"), mode="r").readlines().lines_to_paragraphs()

    check_resume_at_every_cut(make, seed=1, cut_epochs=(0,))
