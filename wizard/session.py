"""One diagnosis session from options to reports and exit code: the glue between the CLI, the
engine, the prompters, the view and the report writers."""

from __future__ import annotations

import shutil
from pathlib import Path

from nnwizard import cuda_lost
from nnwizard.budget import calibrate
from nnwizard.catalog import load_catalog
from nnwizard.engine import Diagnosis, Engine, Event
from nnwizard.errors import ExitCode
from nnwizard.isolation import preserved_state, seed_everything
from nnwizard.prompts import SYMPTOMS_KEY, QuestionaryPrompter, ScriptedPrompter, load_answers, save_answers
from nnwizard.options import Options, check, exit_code, failure_reasons  # noqa: F401 - (Options: re-exported)
from nnwizard.report import Report, build
from nnwizard.report import write_reports as write_reports_of
from nnwizard.target import load_target
from nnwizard.tree import load_trees, question_keys


ONE_STEPS = 0.8   # a one-epoch script's second observed run: its pass takes at most this share of the step budget


def _one_pass_rerun(rec, steps: int, exit_kind: str) -> int:
    """The batches a pass may take in a second observed run when the batch cap ended the training passes of a
    script that then finished well short of its ``steps`` (its whole training one epoch): ONE_STEPS of the steps,
    so that the pass ends before the step budget and its evaluation is recorded too, and what fits the time limit
    at the first run's step time; 0 (no rerun) unless that is at least twice the steps the first run took."""
    from nnwizard.script_run import DEFAULT_TIME_LIMIT_S, BatchCap
    from nnwizard.script_target import step_time

    if exit_kind != "finished" or not rec.capped_training or rec.total_steps >= steps / 2:
        return 0
    per_step = step_time(rec)
    fit = int(ONE_STEPS * steps)
    if per_step:
        fit = min(fit, int(DEFAULT_TIME_LIMIT_S / (BatchCap.ONE_PASS * per_step)))
    return fit if fit >= 2 * rec.total_steps else 0


def _load_script_target(opts: Options, listener):
    from nnwizard.engine import Event
    from nnwizard.live import Progress
    from nnwizard.probes.api import run_listeners
    from nnwizard.script_run import (DEFAULT_LIMIT_BATCHES, DEFAULT_MAX_STEPS, BatchCap, RunOptions, RunResult,
                                     ScriptInterrupted, StepFit, load_script, run_script)
    from nnwizard.script_target import ScriptTarget

    script = load_script(opts.script)
    steps = opts.max_steps or DEFAULT_MAX_STEPS
    if listener is not None:
        listener(Event("script-start", data={"script": str(script.path), "args": opts.script_args, "max_steps": steps}))

    def observe(limit_batches: int, passes: float = BatchCap.PASSES) -> "RunResult":
        declared = [spec.make() for spec in run_listeners()]  # what the probes follow on the live run (probes/api.py)
        try:
            return run_script(script, opts.script_args, RunOptions(
                max_steps=steps, seed=opts.seed, limit_batches=limit_batches, cap_passes=passes,
                listeners=[StepFit(extend=not opts.max_steps), *declared]
                + ([Progress(listener)] if listener is not None else [])))
        finally:
            for each in declared:
                if hasattr(each, "close"):
                    each.close()

    try:
        run = observe(DEFAULT_LIMIT_BATCHES)
        longer = _one_pass_rerun(run.recording, steps, run.exit)
        if longer:
            # the cap, there so that the run sees an evaluation and the next epoch, ended the script's only training
            # (one epoch, or two short ones): run it again with one pass as long as the step budget and the time allow
            first, superseded = run.recording, run.scratch
            run = observe(longer, BatchCap.ONE_PASS)
            if superseded is not None:   # nnwizard's own folder for what the first run wrote: the second run's replaces it
                shutil.rmtree(superseded, ignore_errors=True)
            run.recording.notes.insert(0, f"a first run took {first.total_steps} optimizer steps in {first.capped_training} "
                                          f"training pass(es) ended by the batch cap, and then the script finished: this "
                                          f"run lets a pass take up to {longer} batches")
    except ScriptInterrupted as stop:  # Ctrl-C: what was recorded until then goes into a partial report
        run = stop.result
    target = ScriptTarget(run)
    target.distributed = opts.distributed   # (None unless the script also ran on several ranks: tree `distributed`)
    if listener is not None:
        listener(Event("script-observed", data={"observed": target.observed()}))
    return target


def select_trees(trees: dict, target) -> dict:
    """The trees for this kind of target (``modes`` in the tree files)."""
    if getattr(target, "mode", "module") != "script":
        wanted = {"module"}
    else:
        wanted = {"script"} | ({"script-model"} if target.capturable else set())
        wanted |= {"distributed"} if getattr(target, "distributed", None) is not None else set()
    return {k: t for k, t in trees.items() if wanted & set(t.modes)}


def _in_torchrun() -> bool:
    from nnwizard.distributed.env import in_torchrun

    return in_torchrun()


def diagnose(opts: Options, listener=None, prompter=None, checkpoint=None) -> Diagnosis:
    """Load everything, run the engine; raises NNWizardError on bad input. No files are written. ``prompter``:
    the Prompter class to ask with (given the answers known); ``checkpoint``: gets the partial Diagnosis as it
    grows (after the observed run, then after each probe)."""
    check(opts, load=False)
    trees = load_trees(opts.trees_dir)
    catalog = load_catalog(str(opts.trees_dir) if opts.trees_dir else None)
    answers = load_answers(opts.answers, question_keys(trees)) if opts.answers else {}
    answers.update(opts.preset_answers or {})
    if opts.symptoms:
        answers[SYMPTOMS_KEY] = list(opts.symptoms)
    with cuda_lost.guard("while loading or running the target"), preserved_state():
        seed_everything(opts.seed)
        target = _load_script_target(opts, listener) if opts.script else load_target(opts.module, opts.device)
        trees = select_trees(trees, target)
        if opts.script and target.run.exit == "interrupted":
            return Diagnosis(target, opts.seed, symptoms=[], given_symptoms=list(opts.symptoms), interrupted=True)
        if opts.script:
            from nnwizard.script_view import script_problem

            if script_problem(target):  # nothing trained: one sentence (in the reports) and inconclusive
                return Diagnosis(target, opts.seed, symptoms=[], given_symptoms=list(opts.symptoms),
                                 answers={k: v for k, v in answers.items() if k != SYMPTOMS_KEY})
        prompter = (prompter or (QuestionaryPrompter if opts.interactive else ScriptedPrompter))(answers)
        budget = calibrate(target, opts.budget, min(60.0, opts.probe_timeout or 60.0))
        target.sample_limit = budget.batch
        if listener is not None:
            listener(Event("budget", data={"text": budget.describe(), "budget": budget}))
        if checkpoint is not None:
            checkpoint(Diagnosis(target, opts.seed, symptoms=[], given_symptoms=list(opts.symptoms), budget=budget))
        engine = Engine(target, trees, catalog, prompter, seed=opts.seed, probe_timeout=opts.probe_timeout,
                        listener=listener, budget=budget, checkpoint=checkpoint)
        preset = {k: v for k, v in answers.items() if k != SYMPTOMS_KEY}
        return engine.run(answers.get(SYMPTOMS_KEY), preset)


def write_reports(diagnosis: Diagnosis, opts: Options) -> tuple[object, list[str]]:
    report = build(diagnosis)
    written = write_reports_of(report, opts.json_path, opts.report_path)
    if opts.interactive and (diagnosis.answers or diagnosis.given_symptoms):
        path = opts.save_answers or Path("nnwizard-answers.yaml")
        save_answers(path, diagnosis.given_symptoms, diagnosis.answers)
        written.append(f"{path} (replay with --answers {path})")
    return report, written


def run(opts: Options, listener=None) -> Report:
    """A diagnosis from options to its report: the one entry that the ``diagnose`` command and the Python API
    (``nnwizard.diagnose``, ``nnwizard.testing``) share. Writes the reports that ``opts`` asks for (their paths in
    ``report.written``); raises NNWizardError on bad input (and CudaContextLost, which the command handles)."""
    diagnosis = diagnose(opts, listener=listener)
    report, written = write_reports(diagnosis, opts)
    report._written = list(written)
    return report


def run_session(opts: Options) -> int:
    from nnwizard.view import TerminalView

    if opts.script and (opts.nproc or _in_torchrun()):   # distributed training (CONTRACT §8): nnwizard.distributed
        from nnwizard.distributed import run_distributed

        return run_distributed(opts)

    view = TerminalView(quiet=opts.quiet)
    note = cuda_lost.rerun_note()
    if note and not opts.quiet:
        view.console.print(f"[yellow]{note[0].upper()}{note[1:]}.[/]", highlight=False)
    try:
        report = run(opts, listener=view)
    except cuda_lost.CudaContextLost as lost:
        view.close()
        return cuda_lost.rerun_on_cpu(opts, lost)
    view.summary(report, report.written)
    code = exit_code(report, opts)
    if code == ExitCode.FINDINGS:
        view.failed(failure_reasons(report, opts))
    return code


def probe(opts: Options, probe_id: str, params: dict | None = None, listener=None):
    """One probe on the program ``opts`` names, outside any tree: the program is observed as a diagnosis observes it,
    then ``probe_id`` measures (``nnwizard.testing.assert_overfits_one_batch`` runs ``script-overfit`` here). Returns
    ``(result, target)``; the second entry, with :func:`run`, that the Python API uses."""
    from nnwizard.probes.api import ProbeContext, get

    check(opts, load=False)
    with cuda_lost.guard("while loading or running the target"), preserved_state():
        seed_everything(opts.seed)
        target = _load_script_target(opts, listener) if opts.script else load_target(opts.module, opts.device)
        from nnwizard.isolation import run_probe

        ctx = ProbeContext(target=target, params=dict(params or {}), seed=opts.seed)
        return run_probe(get(probe_id), ctx, opts.probe_timeout), target
