"""problemset.py: bundled sets, local JSONL files with errors that name file, line and field, and the
Hugging Face Hub path (no network: offline mode and a stand-in for the download)."""

import json
import os
import re

import pytest

import problemset



@pytest.mark.parametrize(
    "name, count, with_ids",
    [("math_train", 7470, False), ("aime_1983_2023", 969, True), ("math500", 500, True), ("aime2024", 30, True)],
)
def test_bundled_sets(name, count, with_ids):
    problems = problemset.load_problems(name)
    assert len(problems) == count
    assert all(isinstance(p, problemset.Problem) and p.problem.strip() and p.answer.strip() for p in problems)
    assert all((p.id is not None) == with_ids for p in problems)


def test_aime2024_first_problem():
    first = problemset.load_problems("aime2024")[0]
    assert first.id == "aime_2024_I_1" and first.answer == "204" and first.problem.startswith("Every morning Aya")


def test_training_sets_do_not_contain_evaluation_problems():
    def key(text):
        return re.sub(r"[^a-z0-9]", "", text.lower())

    evaluation = {key(p.problem) for name in ("math500", "aime2024") for p in problemset.load_problems(name)}
    for name in ("math_train", "aime_1983_2023"):
        assert not [p.id for p in problemset.load_problems(name) if key(p.problem) in evaluation], name


def write_lines(tmp_path, lines, name="problems.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_local_jsonl(tmp_path):
    path = write_lines(
        tmp_path,
        [
            json.dumps({"problem": "1+1?", "answer": "2", "id": "a"}),
            "",  # blank lines are allowed
            json.dumps({"problem": "AIME-style", "answer": 204, "id": 7}),  # integer answer and id become strings
            json.dumps({"problem": "x?", "answer": "\\frac{1}{2}", "difficulty": "3/8"}),  # extra fields ignored
        ],
    )
    assert problemset.load_problems(path) == [
        problemset.Problem("1+1?", "2", "a"),
        problemset.Problem("AIME-style", "204", "7"),
        problemset.Problem("x?", "\\frac{1}{2}", None),
    ]


GOOD = json.dumps({"problem": "1+1?", "answer": "2"})


@pytest.mark.parametrize(
    "bad_line, field",
    [
        ('{"problem": "1+1?", "answer": ', "JSON"),
        (json.dumps({"problem": "1+1?"}), "'answer'"),
        (json.dumps({"answer": "2"}), "'problem'"),
        (json.dumps({"problem": "1+1?", "answer": None}), "'answer'"),
        (json.dumps({"problem": "1+1?", "answer": "  "}), "'answer'"),
        (json.dumps({"problem": "", "answer": "2"}), "'problem'"),
        (json.dumps({"problem": "1+1?", "answer": 0.5}), "'answer'"),
        (json.dumps({"problem": ["1+1?"], "answer": "2"}), "'problem'"),
        (json.dumps(["1+1?", "2"]), "JSON object"),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, bad_line, field):
    path = write_lines(tmp_path, [GOOD, GOOD, bad_line, GOOD])
    with pytest.raises(problemset.ProblemFileError) as error:
        problemset.load_problems(path)
    message = str(error.value)
    assert path in message and "line 3" in message and field in message


def test_unknown_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="math_train"):
        problemset.load_problems("math_trian")  # a typo of a bundled name
    with pytest.raises(FileNotFoundError):
        problemset.load_problems(str(tmp_path / "missing.jsonl"))


def test_unreachable_hub_suggests_bundled_data(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network call is made
    for source in ("spiral-ref-tests/no-such-dataset", "spiral-ref-tests/no-such-dataset:train.jsonl"):
        with pytest.raises(problemset.HubUnavailableError) as error:
            problemset.load_problems(source)
        assert isinstance(error.value, RuntimeError)
        message = str(error.value)
        assert "no-such-dataset" in message and "'math_train'" in message and "\n" not in message


def test_hub_dataset_is_read_like_a_local_file(monkeypatch, tmp_path):
    """A stand-in for huggingface_hub.snapshot_download: POLARIS-53K's file layout and fields."""
    import huggingface_hub

    folder = tmp_path / "snapshot"
    folder.mkdir()
    rows = [
        {"problem": "Find $x$.", "answer": "540", "difficulty": "3/8"},
        {"problem": "Find $y$.", "answer": "2", "difficulty": "7/8"},
    ]
    write_lines(folder, [json.dumps(r) for r in rows], name="polaris-data-53K.jsonl")
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    problems = problemset.load_problems("POLARIS-Project/Polaris-Dataset-53K")
    assert problems == [problemset.Problem("Find $x$.", "540"), problemset.Problem("Find $y$.", "2")]
    (repo_id, kwargs), = calls
    assert repo_id == "POLARIS-Project/Polaris-Dataset-53K" and kwargs["repo_type"] == "dataset"
    assert kwargs["allow_patterns"] == ["*.jsonl"]

    write_lines(folder, [json.dumps(rows[0])], name="second.jsonl")  # two files: ambiguous, must be named
    with pytest.raises(ValueError, match="second.jsonl"):
        problemset.load_problems("POLARIS-Project/Polaris-Dataset-53K")
    assert os.path.exists(folder / "second.jsonl")


# ----------------------------------------------------------------------------------------------------------------------
# Edges a plausible bug would get wrong


@pytest.mark.parametrize("answer", [True, False])
def test_a_json_boolean_answer_is_refused_not_read_as_true(tmp_path, answer):
    path = write_lines(tmp_path, [GOOD, json.dumps({"problem": "Is 2 prime?", "answer": answer})])
    with pytest.raises(problemset.ProblemFileError, match="line 2: field 'answer' must be a non-empty string"):
        problemset.load_problems(path)


def test_a_missing_local_file_is_not_found_without_asking_the_hub(tmp_path, monkeypatch):
    """"data/x.jsonl" also matches the Hub's "owner/name" pattern; a missing file must not turn into a download."""
    monkeypatch.setattr(problemset, "_fetch_from_hub", lambda source: pytest.fail(f"asked the Hub for {source}"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for source in ["data/x.jsonl", "data/x.json", "./x.jsonl", str(tmp_path / "data" / "x.jsonl")]:
        with pytest.raises(FileNotFoundError, match=f"^{re.escape(source)}: no such file$"):
            problemset.load_problems(source)
    calls = []
    monkeypatch.setattr(problemset, "_fetch_from_hub", lambda source: calls.append(source) or [])
    problemset.load_problems("owner/name:data/x.jsonl")  # a file inside a Hub dataset is still the Hub's
    assert calls == ["owner/name:data/x.jsonl"]


def test_blank_lines_anywhere_and_the_ids_as_given(tmp_path):
    path = write_lines(tmp_path, ["", GOOD, "   ", "", json.dumps({"problem": "3?", "answer": "3", "id": 0}),
                                  json.dumps({"problem": "4?", "answer": "4", "id": None}), ""])
    assert problemset.load_problems(path) == [problemset.Problem("1+1?", "2", None), problemset.Problem("3?", "3", "0"),
                                              problemset.Problem("4?", "4", None)]
    path = write_lines(tmp_path, [GOOD, "", "", "not json"])
    with pytest.raises(problemset.ProblemFileError, match="line 4: not valid JSON"):  # blank lines counted
        problemset.load_problems(path)


def test_each_size_limit_accepts_its_limit_and_refuses_one_more(tmp_path, monkeypatch):
    line = json.dumps({"problem": "x" * 50, "answer": "2"}) + "\n"
    monkeypatch.setattr(problemset, "MAX_LINE_BYTES", len(line))  # the line with its newline, exactly at the limit
    path = write_lines(tmp_path, [line.rstrip("\n")])
    assert len(problemset.load_problems(path)) == 1
    monkeypatch.setattr(problemset, "MAX_LINE_BYTES", len(line) - 1)
    with pytest.raises(problemset.ProblemFileError, match="line 1: longer than"):
        problemset.load_problems(path)

    monkeypatch.setattr(problemset, "MAX_PROBLEM_FILE_BYTES", os.path.getsize(path))
    monkeypatch.setattr(problemset, "MAX_LINE_BYTES", 1000)
    assert len(problemset.load_problems(path)) == 1
    monkeypatch.setattr(problemset, "MAX_PROBLEM_FILE_BYTES", os.path.getsize(path) - 1)
    with pytest.raises(problemset.ProblemFileError, match="more than"):
        problemset.load_problems(path)

    monkeypatch.setattr(problemset, "MAX_PROBLEM_FILE_BYTES", 1 << 20)
    monkeypatch.setattr(problemset, "MAX_LINE_BYTES", 1 << 20)
    digits = problemset.MAX_INTEGER_DIGITS
    path = write_lines(tmp_path, ['{"problem": "big", "answer": ' + "9" * digits + "}"])
    assert problemset.load_problems(path)[0].answer == "9" * digits
    path = write_lines(tmp_path, ['{"problem": "big", "answer": -' + "9" * (digits + 1) + "}"])
    with pytest.raises(problemset.ProblemFileError, match=f"an integer of {digits + 1:,} digits"):
        problemset.load_problems(path)


def test_hf_hub_offline_set_after_import_is_honoured(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read at import, before the variable
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append(kwargs["local_files_only"])
        write_lines(tmp_path, [GOOD])
        return str(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert len(problemset.load_problems("owner/name")) == 1 and calls == [True]
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    problemset.load_problems("owner/name")
    assert calls == [True, False]
