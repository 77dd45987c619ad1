"""The rich terminal view: renders engine events (progress per probe, results as they come) and the
final ranked table. Tests render to Console(file=StringIO(), width=100)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table
from rich.tree import Tree as RichTree

from nnwizard.console import make_console
from nnwizard.events import Event
from nnwizard.live import progress_text
from nnwizard.locations import render
from nnwizard.ranking import FINDING
from nnwizard.report import Report

SHOWN = 0.2  # hypotheses below this confidence stay out of the terminal table (the reports list all)
_STYLE = {"passed": ("✓", "green"), "failed": ("✗", "red"), "errored": ("!", "yellow"), "skipped": ("-", "dim")}


class TerminalView:
    def __init__(self, console: Console | None = None, quiet: bool = False):
        self.console = console or make_console(stderr=True)
        self.quiet = quiet
        self._status: Status | None = None

    def __call__(self, event: Event) -> None:
        if self.quiet:
            return
        c = self.console
        if event.kind == "budget":
            c.print(f"[dim]{escape(event.data['text'])}[/]", highlight=False)
        elif event.kind == "tree-start":
            c.print(f"\n[bold cyan]▶ {escape(event.data['title'])}[/] [dim]({escape(event.tree)})[/]")
        elif event.kind == "probe-start":
            self._stop()
            self._status = c.status(f"[bold]{escape(event.data['probe'])}[/]: {escape(event.data['title'])}…", spinner="dots")
            self._status.start()
        elif event.kind == "probe-progress" and self._status is not None:
            pct = f"{100 * event.data['fraction']:.0f}%"
            self._status.update(f"[bold]{escape(event.data['probe'])}[/] {pct} {escape(event.data['text'])}")
        elif event.kind == "probe-end":
            self._stop()
            r = event.data["result"]
            mark, style = _STYLE[r.status]
            c.print(f"  [{style}]{mark} {escape(f'{r.id:<22}')}[/] {escape(render(r.summary))} [dim]({r.duration_s:.1f}s)[/]", highlight=False)
        elif event.kind == "conclusion":
            e = event.data["evidence"]
            sign, style = ("+", "magenta") if e.weight > 0 else ("−", "dim")
            c.print(f"    [{style}]{sign} {escape(e.hypothesis)}[/] [dim]{abs(e.weight):.2f}[/]", highlight=False)
        elif event.kind == "question":
            self._stop()
        elif event.kind == "script-start":
            self._stop()
            d = event.data
            c.print(f"[bold cyan]▶ Running {escape(' '.join([str(d['script']), *d['args']]))}[/] [dim](at most {d['max_steps']} "
                    f"optimizer steps; {escape(d.get('kept') or 'its output and files are kept aside')})[/]", highlight=False)
            self._status = c.status("[dim]starting the script…[/]", spinner="dots")
            self._status.start()
        elif event.kind == "script-progress" and self._status is not None:
            self._status.update(f"[bold]observed run[/] {escape(progress_text(event.data))}")
        elif event.kind == "script-note":
            c.print(f"  [yellow]{escape(event.data.get('text', ''))}[/]", highlight=False)
        elif event.kind == "script-observed":
            self._stop()
            from nnwizard.script_view import print_observed

            print_observed(c, event.data["observed"])

    def close(self) -> None:
        """Stop the spinner (the session ends without a summary)."""
        self._stop()

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def summary(self, report: Report, files: list[str]) -> None:
        self._stop()
        c = self.console
        c.print()
        shown = [h for h in report.hypotheses if h.confidence >= SHOWN][:8]
        if not shown:
            c.print(f"[{'bold green' if report.verdict == 'healthy' else 'bold yellow'}]No hypothesis gathered more than weak evidence.[/]")
        else:
            table = Table(title="Ranked hypotheses", show_lines=True, expand=True)
            table.add_column("#", width=2)
            table.add_column("hypothesis", no_wrap=True)
            table.add_column("conf.", width=5)
            table.add_column("what was measured", ratio=3)
            table.add_column("fix", ratio=2, overflow="fold")
            for i, h in enumerate(shown):
                style = "bold red" if h.confidence >= FINDING else "yellow"
                measured = escape("\n".join(f"• {e}" for e in h.evidence[:3]))
                table.add_row(str(i + 1), f"[{style}]{escape(h.id)}[/]", f"{h.confidence:.2f}", f"[bold]{escape(h.title)}[/]\n{measured}",
                              escape(h.fix_here or h.fix))
            c.print(table)
        weaker = len(report.hypotheses) - len(shown)
        if weaker:
            c.print(f"[dim]{weaker} weaker hypothes{'is' if weaker == 1 else 'es'} (below {SHOWN}) "
                    f"{'is' if weaker == 1 else 'are'} listed in the reports.[/]")
        if "ambiguous" in report.task_source:
            c.print(f"[yellow]Task: {escape(report.task)} ({escape(report.task_source)}).[/]")
        if report.ended:
            c.print(f"[bold yellow]The diagnosis was cut short: {escape(report.ended.get('text', ''))}[/]", highlight=False)
            for line in (report.ended.get("stack") or [])[:4]:
                c.print(f"  [dim]{escape(line)}[/]", highlight=False)
        verdict_style = {"problems-found": "bold red", "healthy": "bold green", "inconclusive": "bold yellow"}[report.verdict]
        c.print(f"Verdict: [{verdict_style}]{report.verdict}[/]" + (" (interrupted: partial)" if report.interrupted else ""))
        if report.not_run:
            head = "could not measure or left something unexplained (a crash, a loss that did not move)"
            if report.verdict == "inconclusive":
                head += ", so the verdict cannot be healthy"
            c.print(f"[yellow]{len(report.not_run)} probe{'s' if len(report.not_run) != 1 else ''} {head}:[/]")
            for n in report.not_run[:8]:
                c.print(f"  [yellow]! {escape(f'{n.probe:<22}')}[/] [dim]{escape(n.why)}[/] {escape(n.reason)}", highlight=False)
            if len(report.not_run) > 8:
                c.print(f"  [dim]... and {len(report.not_run) - 8} more, listed in the reports[/]")
        for f in files:
            c.print(f"[dim]wrote {escape(str(f))}[/]", highlight=False)
        if report.mode == "replay":
            loc = report.localised
            c.print(escape(f"replay of step {report.step} ({report.trigger}: {report.reason})"
                           + (f"\n  localised: {loc['text']} ({loc['phase']})" if loc else "\n  localised: no op named")), highlight=False)

    def failed(self, reasons: list[str]) -> None:
        """Why the exit code is 1 (--fail-on, --strict): the last lines a CI log shows."""
        for reason in reasons:
            self.console.print(f"[bold red]fail:[/] {escape(render(reason))}", highlight=False)


def draw_tree(tree) -> RichTree:
    """A rich drawing of a decision tree, each node with its kind and routes."""
    root = RichTree(f"[bold]{tree.id}[/]: {tree.title}  [dim]symptoms: {', '.join(tree.symptoms)}[/]")

    def label(name: str) -> str:
        node = tree.nodes[name]
        if node.kind == "probe":
            return f"[cyan]{name}[/]: probe [bold]{node.probe}[/]" + (f" {node.params}" if node.params else "")
        if node.kind == "ask":
            return f"[cyan]{name}[/]: ask [italic]{node.ask}[/] [dim](key {node.key}, default {node.default})[/]"
        if node.kind == "branch":
            return f"[cyan]{name}[/]: branch on {node.branch}"
        return f"[cyan]{name}[/]: conclude " + ", ".join(f"[magenta]{c.hypothesis}[/] {c.weight:+.2f}" for c in node.conclude)

    for name, node in tree.nodes.items():
        branch = root.add(label(name) + ("  [green](start)[/]" if name == tree.start else ""))
        for value, target in {**node.on, **node.cases}.items():
            branch.add(f"{value} → [cyan]{target}[/]")
        for test in node.when:
            branch.add(f"if {test.test} → [cyan]{test.goto}[/]")
        if node.next != "end" or node.on or node.cases or node.when:
            branch.add(f"{'otherwise' if (node.on or node.cases or node.when) else 'then'} → [cyan]{node.next}[/]")
    return root
