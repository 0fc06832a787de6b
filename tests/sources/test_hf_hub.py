"""``plateauscope import hf:ORG/NAME`` and ``analyze`` fetching just in time, against a hub served on 127.0.0.1
(:mod:`tests.sources.hub_server`) that the real ``huggingface_hub`` client talks to through ``HF_ENDPOINT``."""

from __future__ import annotations

import errno
import hashlib
import json
import subprocess
import sys

import pytest

import plateauscope as ps
from plateauscope.analysis.results import load_records, probe_steps_path
from plateauscope.cli import main as cli_main
from plateauscope.runs.files import ANALYSIS_DIR, MODEL_CONFIG_DIR, SERIES_FILE, RunError
from plateauscope.runs.series import ImportedSeries
from plateauscope.sources.hf_hub import HubFetcher, import_hub, is_hub_series, listing
from plateauscope.sources.found import SourceError
from plateauscope.sources.importer import import_series
from tests.sources.hub_server import Hub, serve
from tests.sources.series_builders import save_word_tokenizer

REPO = "EleutherAI/tiny-pythia"
STEPS = (0, 40, 80, 120)


@pytest.fixture
def hub(neox_series, tmp_path, monkeypatch):
    """The tiny GPT-NeoX series as Pythia's step revisions on a local hub, ``HF_ENDPOINT`` pointing at it, an empty
    ``HF_HUB_CACHE``, online."""
    from huggingface_hub import constants

    source, _ = neox_series
    served = Hub()
    commits = {s: served.add(REPO, f"step{s}", {f: (source / f"checkpoint-{s}" / f).read_bytes()
                                                for f in ("config.json", "model.safetensors")}) for s in STEPS}
    served.add(REPO, "main", served.commits[commits[STEPS[-1]]])
    server = serve(served)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield served, commits, tmp_path / "hub_cache" / f"models--{REPO.replace('/', '--')}"
    server.close()


def _cli(capsys, *argv):
    """Run the command line; (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code, err, *matches):
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for match in matches:
        assert match in err, err


def _analyze(capsys, run, *extra):
    return _cli(capsys, "analyze", "--run", str(run), "--probe-only", "--no-progress", *extra)


def _records(run):
    """The probe pass's per-step records."""
    return load_records(probe_steps_path(run, "induction"))


def _weights_cached(repo_folder):
    """Snapshots in the cache holding a weights file."""
    return sorted(p.parent.name for p in repo_folder.glob("snapshots/*/model.safetensors"))


def test_import_reads_the_listing_only_and_analyze_matches_the_local_files(hub, neox_series, tmp_path, capsys):
    served, commits, repo_folder = hub
    code, out, err = _cli(capsys, "import", f"hf:{REPO}", "--out", str(tmp_path / "run"), "--no-progress")
    assert code == 0, err
    assert "4 checkpoints of GPTNeoXForCausalLM, steps 0..120" in out
    manifest = json.loads((tmp_path / "run" / SERIES_FILE).read_text())
    assert manifest["source"] == f"hf:{REPO}"
    for entry, step in zip(manifest["checkpoints"], STEPS):
        data = served.commits[commits[step]]["model.safetensors"]
        assert (entry["step"], entry["revision"], entry["commit"], entry["repo"]) == (step, f"step{step}",
                                                                                    commits[step], REPO)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
        assert entry["file"] == str(repo_folder / "snapshots" / commits[step] / "model.safetensors")
        assert served.full_gets(commits[step], "model.safetensors") == 0  # its header only, by Range
    assert _weights_cached(repo_folder) == [] and is_hub_series(tmp_path / "run")

    code, out, err = _analyze(capsys, tmp_path / "run")
    assert code == 0, err
    assert all(served.full_gets(commits[s], "model.safetensors") == 1 for s in STEPS)
    source, _ = neox_series
    import_series(source, tmp_path / "local", steps=list(STEPS))
    assert _analyze(capsys, tmp_path / "local")[0] == 0
    assert _records(tmp_path / "run") == _records(tmp_path / "local") and len(_records(tmp_path / "run")) == 4
    code, _, err = _analyze(capsys, tmp_path / "run")  # everything cached: nothing fetched again
    assert code == 0 and all(served.full_gets(commits[s], "model.safetensors") == 1 for s in STEPS), err


def test_the_tokenizer_is_copied_into_the_run(hub, tmp_path):
    served, commits, _ = hub
    save_word_tokenizer(tmp_path / "tok", 24)
    files = {p.name: p.read_bytes() for p in (tmp_path / "tok").iterdir()}
    for step in STEPS:
        served.commits[commits[step]].update(files)
    result = import_hub(f"hf:{REPO}", tmp_path / "run", revisions=["step0", "step120"])
    model = tmp_path / "run" / MODEL_CONFIG_DIR
    assert result.tokenizer == str(model.resolve()) and {f: (model / f).read_bytes() for f in files} == files
    assert ImportedSeries(tmp_path / "run").loaded_tokenizer.bos_token_id == 1


def test_log_spaced_and_revisions_choose_among_the_listed_ones(hub, tmp_path):
    assert import_hub(f"hf:{REPO}", tmp_path / "a", log_spaced=2).steps == [0, 120]
    assert import_hub(f"hf:{REPO}", tmp_path / "b", revisions=["step80", "step0"]).steps == [0, 80]


def test_a_missing_revision_or_model_is_one_line_listing_what_there_is(hub, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = _cli(capsys, "import", f"hf:{REPO}", "--out", str(out), "--revisions", "step0,step7")
    _one_line(code, err, f"hf:{REPO}: revision step7 is not on the hub", "it has: step0, step40, step80, step120")
    code, _, err = _cli(capsys, "import", "hf:EleutherAI/pythia-70m", "--out", str(out))
    _one_line(code, err, "hf:EleutherAI/pythia-70m: no such model on the hub")
    code, _, err = _cli(capsys, "import", f"hf:{REPO}", "--out", str(out), "--revisions", "main")
    _one_line(code, err, "revision main has no step in its name")
    assert not out.exists()
    assert listing([f"step{i}" for i in range(20)]) == "step0, step1, step2, step3, step4, ..., step17, step18, " \
                                                        "step19 (20 in all)"


def test_a_connection_dropped_mid_file_is_resumed(hub, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    served, commits, _ = hub
    import_hub(f"hf:{REPO}", tmp_path / "run")
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256)  # the client's reads, smaller than the tiny file
    served.drop_after[(commits[40], "model.safetensors")] = 1000
    code, _, err = _analyze(capsys, tmp_path / "run")
    assert code == 0, err
    assert not served.drop_after  # it was dropped, and the client asked for the rest with a Range request
    fetches = [rng for method, path, rng in served.requests
               if method == "GET" and path.endswith(f"{commits[40]}/model.safetensors") and rng != "bytes=0-100000"]
    assert len(fetches) == 2 and fetches[0] is None and fetches[1].startswith("bytes=") \
        and 0 < int(fetches[1][6:].rstrip("-")) <= 1000, fetches
    assert [r["step"] for r in _records(tmp_path / "run")] == list(STEPS)


def test_bytes_that_differ_from_the_listing_are_one_line_and_nothing_is_analysed_from_them(hub, tmp_path, capsys):
    served, commits, repo_folder = hub
    import_hub(f"hf:{REPO}", tmp_path / "run")
    good = served.commits[commits[80]]["model.safetensors"]
    served.served[(commits[80], "model.safetensors")] = good[:-4] + bytes(4)
    code, _, err = _analyze(capsys, tmp_path / "run")
    _one_line(code, err, f"hf:{REPO}: revision step80 (model.safetensors): the fetched bytes' SHA-256",
              "differs from the hub's listing", "nothing analysed from it")
    assert [r["step"] for r in _records(tmp_path / "run")] == [0, 40]
    assert commits[80] not in _weights_cached(repo_folder)  # not kept: a rerun fetches it again
    del served.served[(commits[80], "model.safetensors")]
    code, _, err = _analyze(capsys, tmp_path / "run")
    assert code == 0, err
    assert [r["step"] for r in _records(tmp_path / "run")] == list(STEPS)
    assert served.full_gets(commits[0], "model.safetensors") == 1  # resumed: the analysed ones not fetched again


def test_a_full_disk_is_one_line_and_a_rerun_after_freeing_resumes(hub, tmp_path, capsys, monkeypatch):
    import huggingface_hub.file_download as fd

    served, commits, _ = hub
    import_hub(f"hf:{REPO}", tmp_path / "run")
    real = fd.http_get

    class Full:
        """A file on a full disk: the first write fails."""

        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    def http_get(url, temp_file, **kwargs):
        return real(url, Full(temp_file) if commits[80] in url else temp_file, **kwargs)

    monkeypatch.setattr(fd, "http_get", http_get)
    code, _, err = _analyze(capsys, tmp_path / "run")
    _one_line(code, err, f"hf:{REPO}: revision step80 (model.safetensors): no space left on the disk")
    assert [r["step"] for r in _records(tmp_path / "run")] == [0, 40]
    monkeypatch.setattr(fd, "http_get", real)  # space freed
    code, _, err = _analyze(capsys, tmp_path / "run")
    assert code == 0, err
    assert [r["step"] for r in _records(tmp_path / "run")] == list(STEPS)
    assert all(served.full_gets(commits[s], "model.safetensors") == 1 for s in (0, 40))


def test_keep_holds_the_cache_to_its_last_revisions(hub, tmp_path, capsys):
    served, commits, repo_folder = hub
    import_hub(f"hf:{REPO}", tmp_path / "run")
    code, _, err = _analyze(capsys, tmp_path / "run", "--keep", "1")
    assert code == 0, err
    assert _weights_cached(repo_folder) == [commits[120]]
    shas = {hashlib.sha256(served.commits[commits[s]]["model.safetensors"]).hexdigest() for s in STEPS}
    assert len([p for p in (repo_folder / "blobs").iterdir() if p.name in shas]) == 1
    assert (tmp_path / "run" / ANALYSIS_DIR).is_dir() and len(_records(tmp_path / "run")) == 4
    code, _, err = _cli(capsys, "analyze", "--run", str(tmp_path / "run"), "--keep", "0", "--probe-only")
    _one_line(code, err, "--keep must be at least 1")


def test_the_api_fetches_a_hub_series_as_the_command_does(hub, neox_series, tmp_path, capsys):
    """``ps.analyze(run, keep=1)`` on a hub series fetches each revision as the command does: the same records, the
    cache held to one revision; ``keep`` on a series on the disk is one line."""
    _, commits, repo_folder = hub
    for name in ("cli", "api"):
        import_hub(f"hf:{REPO}", tmp_path / name)
    code, _, err = _analyze(capsys, tmp_path / "cli", "--keep", "1")
    assert code == 0, err
    HubFetcher.for_run(tmp_path / "cli").forget(*_weights_cached(repo_folder))  # the API fetches every revision again
    ps.analyze(tmp_path / "api", keep=1, probe_only=True, progress=False)
    assert _weights_cached(repo_folder) == [commits[120]]
    for name in ("probe_induction.jsonl", "probe_induction.json"):
        assert (tmp_path / "api" / ANALYSIS_DIR / name).read_bytes() == (tmp_path / "cli" / ANALYSIS_DIR / name).read_bytes()
    local = import_series(neox_series[0], tmp_path / "local").path
    with pytest.raises(SourceError, match="is not a series imported from the hub"):
        ps.analyze(local, keep=1, probe_only=True, progress=False)


def test_offline_reads_the_cache_and_names_every_revision_it_lacks(hub, tmp_path, capsys, monkeypatch):
    served, commits, repo_folder = hub
    import_hub(f"hf:{REPO}", tmp_path / "run")
    assert _analyze(capsys, tmp_path / "run", "--keep", "2")[0] == 0
    assert _weights_cached(repo_folder) == sorted([commits[80], commits[120]])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(served.requests)
    code, _, err = _analyze(capsys, tmp_path / "run", "--steps", "80", "120")  # cached: no request made
    assert code == 0 and len(served.requests) == n, err
    for file in (tmp_path / "run" / ANALYSIS_DIR).iterdir():  # a fresh analysis, offline
        file.unlink()
    code, _, err = _analyze(capsys, tmp_path / "run")
    _one_line(code, err, "HF_HUB_OFFLINE is set", "lacks 2 of the series' 4 revisions: step0, step40")
    assert len(served.requests) == n
    code, _, err = _cli(capsys, "import", f"hf:{REPO}", "--out", str(tmp_path / "again"))
    _one_line(code, err, "HF_HUB_OFFLINE is set", f"hf-cache:{REPO}")


def test_a_series_without_a_fetcher_names_what_to_run(hub, tmp_path):
    _, commits, _ = hub
    import_hub(f"hf:{REPO}", tmp_path / "run")
    series = ImportedSeries(tmp_path / "run")
    with pytest.raises(RunError, match="is not in the local Hugging Face cache; plateauscope analyze"):
        series.state(0)
    assert series.verify() == []  # not fetched is not a problem
    fetcher = HubFetcher.for_run(tmp_path / "run", keep=1)
    fetched = ImportedSeries(tmp_path / "run", fetcher)
    assert set(fetched.state(40)) == set(fetched.state(0))
    assert fetcher.missing() == ["step40", "step80", "step120"] and fetcher.evicted == [commits[40]]


def test_shards_fetch_their_own_revisions_and_equal_one_process(hub, tmp_path, capsys):
    """``analyze --executor submitit-local --shards 2 --keep 1``: each shard fetches its share from the hub; the
    probe's records equal one process's byte for byte, and the cache holds at most shards x keep + 1 revisions."""
    pytest.importorskip("submitit")
    _, _, repo_folder = hub
    runs = {name: tmp_path / name for name in ("alone", "sharded")}
    for run in runs.values():
        code, _, err = _cli(capsys, "import", f"hf:{REPO}", "--out", str(run), "--no-progress")
        assert code == 0, err
    code, _, err = _analyze(capsys, runs["alone"], "--keep", "1", "--threads", "1", "--workers", "1")
    assert code == 0, err
    HubFetcher.for_run(runs["alone"]).forget(*_weights_cached(repo_folder))  # the shards fetch every revision again
    assert _weights_cached(repo_folder) == []
    # the command in a process of its own, as a user runs it (the shards are pickled, which the test session's
    # type-checking wrappers of the package's functions are not)
    done = subprocess.run([sys.executable, "-m", "plateauscope", "analyze", "--run", str(runs["sharded"]), "--probe-only",
                           "--no-progress", "--keep", "1", "--threads", "1", "--executor", "submitit-local", "--shards",
                           "2"], capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line.split(":")[0] for line in out.splitlines() if line.startswith("shard ")) == \
        ["shard 1 of 2", "shard 2 of 2"]
    for name in ("probe_induction.jsonl", "probe_induction.json"):
        assert (runs["sharded"] / ANALYSIS_DIR / name).read_bytes() == (runs["alone"] / ANALYSIS_DIR / name).read_bytes()
    assert 1 <= len(_weights_cached(repo_folder)) <= 2 * 1 + 1
