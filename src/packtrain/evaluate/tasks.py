"""Task suites through lm-evaluation-harness: a local task YAML scored on the in-memory model, per document.

    suite YAML (data-only: no `!function`, local files only)         lm-eval, on the loaded model
      task: packtrain_wordorder                                      HFLM(pretrained=model, tokenizer=tok)
      dataset_path: json                                             simple_evaluate(tasks=[task],
      dataset_kwargs: {data_files: {test: wordorder.jsonl}}              task_manager=TaskManager(include_path=tmp,
      test_split: test                                                       include_defaults=False),
      output_type: multiple_choice                                       log_samples=True)
      doc_to_text: "{{context}}"  doc_to_choice: "{{choices}}"       → acc ± stderr, and acc per doc_id
      doc_to_target: "{{label}}"

`data_files` are resolved against the YAML's directory, checked to exist and hashed (the suite's md5 covers the
YAML and every data file); lm-eval then reads a rewritten copy of the YAML with absolute paths from a temporary
include directory, so the run does not depend on the working directory; lm-eval's own shipped tasks are not
indexed (include_defaults=False: that index parses ~14,000 YAMLs, ≈14 s a call on a 2-core CPU). Nothing is
downloaded (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE during the call). Supported output types: multiple_choice (metric acc) and generate_until
(metric exact_match); per-document results feed the paired decision like any suite's.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import InputDataError, MissingDataError

if TYPE_CHECKING:
    from packtrain.config.evaluate import SuiteConfig
    from packtrain.evaluate.suite_types import TaskSuite

OUTPUT_TYPES = {"multiple_choice": "acc", "generate_until": "exact_match"}
DATASET_BUILDERS = ("json", "csv", "parquet")
REQUIRED = ("task", "dataset_path", "dataset_kwargs", "output_type", "doc_to_text", "doc_to_target")


@dataclass
class TaskResult:
    metric: dict                          # {"metric": "acc", "value": 0.71, "stderr": 0.03, "n": 120}
    per_doc: list[tuple[int, float]]      # (doc_id, 1.0 | 0.0)


def data_files(where: str, spec: dict, base: Path) -> dict[str, str]:
    files = (spec.get("dataset_kwargs") or {}).get("data_files") if isinstance(spec.get("dataset_kwargs"), dict) else None
    if isinstance(files, str):
        files = {"test": files}
    if not isinstance(files, dict) or not files or not all(isinstance(v, str) for v in files.values()):
        raise InputDataError(f"{where}: field dataset_kwargs.data_files must map split names to local files "
                             "(e.g. {test: data.jsonl})")
    out = {}
    for split, f in files.items():
        if "://" in f:
            raise InputDataError(f"{where}: dataset_kwargs.data_files.{split} {f!r} is a URL; only local files")
        p = (base / f).resolve()
        if not p.is_file():
            raise MissingDataError(f"{where}: dataset_kwargs.data_files.{split}: {p} does not exist")
        out[str(split)] = str(p)
    return out


def read_task_yaml(where: str, path: Path) -> dict:
    """The task YAML as a dict, checked (module doc); errors name the suite, the file and the field."""
    import yaml

    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.constructor.ConstructorError as e:
        raise InputDataError(f"{where}.path: {path}: {e.problem} — suite task YAMLs are data only (no !function)"
                             ) from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InputDataError(f"{where}.path: {path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(spec, dict):
        raise InputDataError(f"{where}.path: {path} must be a mapping of lm-eval task fields")
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise InputDataError(f"{where}.path: {path} lacks field(s) {', '.join(missing)} (a local lm-eval task needs "
                             f"{', '.join(REQUIRED)})")
    if not isinstance(spec["task"], str) or not spec["task"].strip():
        raise InputDataError(f"{where}.path: {path}: field task must be a task name")
    if spec["dataset_path"] not in DATASET_BUILDERS:
        raise InputDataError(f"{where}.path: {path}: field dataset_path {spec['dataset_path']!r} is not allowed "
                             f"(local files only: {', '.join(DATASET_BUILDERS)})")
    if spec["output_type"] not in OUTPUT_TYPES:
        raise InputDataError(f"{where}.path: {path}: field output_type {spec['output_type']!r} is not allowed "
                             f"(allowed: {', '.join(OUTPUT_TYPES)})")
    if spec["output_type"] == "multiple_choice" and "doc_to_choice" not in spec:
        raise InputDataError(f"{where}.path: {path}: output_type multiple_choice needs field doc_to_choice")
    return spec


def load_task_suite(where: str, sc: SuiteConfig, path: Path) -> TaskSuite:
    from packtrain.evaluate.suite_types import TaskSuite
    from packtrain.versioning import files_md5

    spec = read_task_yaml(f"{where}", path)
    files = data_files(f"{where}.path: {path}", spec, path.parent)
    task = sc.task or spec["task"]
    if task != spec["task"]:
        raise InputDataError(f"{where}.task: {task!r} is not the task {path} defines ({spec['task']!r})")
    md5 = files_md5({path.name: path, **{f"data/{k}": Path(v) for k, v in files.items()}})
    return TaskSuite(sc.name, sc.role, str(path), md5, task, files, sc.max_documents)


@contextlib.contextmanager
def _include_dir(suite: TaskSuite) -> Iterator[Path]:
    """A temporary include directory holding the YAML with absolute data_files."""
    import yaml

    spec = read_task_yaml(f"suite {suite.name!r}", Path(suite.path))
    spec["dataset_kwargs"] = {**spec["dataset_kwargs"], "data_files": dict(suite.data_files)}
    tmp = Path(tempfile.mkdtemp(prefix="packtrain-task-"))
    from packtrain.paths import patched_env

    try:
        (tmp / f"{suite.task}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
        with patched_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"):   # nothing from a hub, ever
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # our own temporary include directory, never user data


def score_task(model, tokenizer, suite: TaskSuite, device, batch_size: int = 16,
               on_items: Callable[[int, int], None] | None = None) -> TaskResult:
    """Run the suite's task on the loaded model (module doc): the metric with its stderr, and per document.
    `on_items(done, n)` as lm-eval's requests return (counting_lm): about `done` of the task's `n` items scored."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise InputDataError(f"suite {suite.name!r} ({suite.path}) is an lm-eval task, but lm-evaluation-harness "
                             f"is not installed ({e}): pip install lm-eval") from None
    with _include_dir(suite) as inc:
        lm = counting_lm(on_items)(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(device))
        # include_defaults=False: index only our include directory, not lm-eval's ~14,000 shipped task YAMLs
        # (≈14 s of YAML parsing per call on a 2-core CPU); a suite YAML is self-contained (data only, checked).
        tm = TaskManager(include_path=str(inc), include_defaults=False)
        with lean_result_extras():
            res = simple_evaluate(model=lm, tasks=[suite.task], task_manager=tm,
                                  num_fewshot=0, limit=suite.max_documents, log_samples=True, bootstrap_iters=0,
                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    if res is None or suite.task not in res.get("results", {}):
        raise InputDataError(f"suite {suite.name!r}: lm-eval returned no results for task {suite.task!r}")
    out = res["results"][suite.task]
    name = next((m for m in ("acc", "exact_match") if f"{m},none" in out), None)
    if name is None:
        raise InputDataError(f"suite {suite.name!r}: task {suite.task!r} reported {sorted(out)}; packtrain reads "
                             "acc (multiple_choice) or exact_match (generate_until)")
    samples = res["samples"][suite.task]
    per_doc = sorted((int(s["doc_id"]), float(s[name])) for s in samples)
    if not per_doc:
        raise InputDataError(f"suite {suite.name!r}: task {suite.task!r} has no documents")
    n = len(per_doc)
    value = sum(a for _, a in per_doc) / n
    stderr = (value * (1 - value) / max(n - 1, 1)) ** 0.5   # binomial: bootstrap_iters=0 leaves lm-eval's unset
    return TaskResult({"metric": name, "value": value, "stderr": stderr, "n": n}, per_doc)


def counting_lm(on_items: Callable[[int, int], None] | None):
    """lm-eval's HFLM that reports its progress in items: `on_items(done, n)` each time a request returns.

    An item (an lm-eval document) is one request or several (a multiple_choice item: one loglikelihood request
    per choice, 2 for wordorder), returned in lm-eval's own order (longest first), so `done` is the returned
    requests × items / requests: e.g. 120 of 400 requests of 200 items → 60. lm-eval's own request bars are
    off (the stage's bar says it). Requests are counted where lm-eval hands each result to its cache hook
    (`CacheHook.add_partial`: once per request for every request type, with or without a cache)."""
    from lm_eval.api.model import CacheHook
    from lm_eval.models.huggingface import HFLM

    class Counter(CacheHook):
        def __init__(self) -> None:
            super().__init__(None)
            self.done, self.requests, self.items = 0, 0, 0

        def start(self, requests: list) -> None:
            self.done, self.requests = 0, len(requests)
            self.items = len({(r.task_name, r.doc_id) for r in requests}) or len(requests)

        def add_partial(self, attr, req, res) -> None:
            super().add_partial(attr, req, res)
            self.done += 1
            if on_items is not None and self.requests:
                on_items(self.done * self.items // self.requests, self.items)

    class CountingLM(HFLM):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.counter = Counter()
            self.set_cache_hook(self.counter)

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            self.counter.start(requests)
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            self.counter.start(requests)
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests, disable_tqdm: bool = False):
            self.counter.start(requests)
            return super().generate_until(requests, disable_tqdm=True)

    return CountingLM


@contextlib.contextmanager
def lean_result_extras() -> Iterator[None]:
    """Two extras lm-eval adds to its results, which packtrain does not read, made cheap and quiet for the call:
    - `git_hash`: lm-eval runs `git describe --always` in the current directory with git's stderr on ours
      (outside a git checkout every task suite printed "fatal: not a git repository"); here git's stderr is
      captured and the hash recorded is the same.
    - `pretty_env_info`: lm-eval calls torch.utils.collect_env, which starts `pip list` and a dozen probes
      (lscpu, nvidia-smi, gcc, conda, ...): ~1.9 s of wall time and ~1.2 CPU-s for every task suite scored. The
      versions that matter are recorded instead (torch, transformers, lm-eval), as lm-eval records them."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    from lm_eval import evaluator
    from lm_eval.loggers import utils

    def git_hash():
        try:
            out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    def env_info(storage: dict) -> None:
        def ver(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "N/A"
        storage.update({"pretty_env_info": f"torch {ver('torch')} (collect_env not run by packtrain)",
                        "transformers_version": ver("transformers"), "lm_eval_version": ver("lm_eval")})

    saved = [(m, name, getattr(m, name)) for m in (utils, evaluator)   # evaluator holds its own names for them
             for name in ("get_git_commit_hash", "add_env_info") if hasattr(m, name)]
    for m, name, _ in saved:
        setattr(m, name, git_hash if name == "get_git_commit_hash" else env_info)
    try:
        yield
    finally:
        for m, name, fn in saved:
            setattr(m, name, fn)
