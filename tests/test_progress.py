"""The progress bar where stderr is a file or a pipe: whole lines, at most one per interval; the
loss plot a run ends with."""
import io

import pytest

from bertkit.training.log import TimedLines, progress_bar


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_redraws_become_one_line_per_interval_and_the_last_state_is_kept():
    out, clock = io.StringIO(), Clock()
    lines = TimedLines(out, every=30, clock=clock)
    for second in range(0, 95, 5):  # a redraw every 5 s
        clock.now = second
        lines.write(f"\r  {second}/100 s, loss=1.0")
    lines.write("\n")  # the bar closes
    assert out.getvalue().splitlines() == ["0/100 s, loss=1.0", "30/100 s, loss=1.0", "60/100 s, loss=1.0",
                                           "90/100 s, loss=1.0"]
    clock.now = 100  # a closing newline after a written line adds nothing
    lines.write("\r100/100 s")
    lines.write("\n")
    assert out.getvalue().splitlines()[-1] == "100/100 s" and "\r" not in out.getvalue()


def test_a_bar_on_a_pipe_writes_lines_not_carriage_returns(capsys):
    bar = progress_bar(True, total=1000, unit="step")
    for _ in range(1000):
        bar.update(1)
        bar.set_postfix(loss="0.5")  # refreshes on every call, as the loops' records do
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert 1 <= len(lines) <= 3 and "1000/1000" in lines[-1]  # the first draw, the last state
    assert progress_bar(False, total=5).disable


def test_a_line_is_not_repeated_and_only_the_closing_newline_writes_the_last_state():
    out, clock = io.StringIO(), Clock()
    lines = TimedLines(out, every=30, clock=clock)
    lines.write("\r 5/10 step")
    clock.now = 10
    lines.write("\r10/10 step")
    lines.write("")  # tqdm's empty writes (a refresh, the start of close) are not the end
    assert out.getvalue().splitlines() == ["5/10 step"]
    clock.now = 40  # due by the interval, then closed with the same state: written once
    lines.write("\r10/10 step")
    lines.write("\n")
    assert out.getvalue().splitlines() == ["5/10 step", "10/10 step"]


def test_work_between_steps_is_left_out_of_the_bars_rate_and_eta():
    """An evaluation or a checkpoint between steps stops the bar's clock (Loop.bar_paused): the
    bar's elapsed time, its steps per second and its ETA are the steps' own."""
    import types

    from bertkit.training.loop import Loop

    now = [100.0]  # the bar's clock, driven here
    bar = progress_bar(True, total=4, unit="step")
    bar._time = lambda: now[0]
    bar.start_t = bar.last_print_t = now[0]
    now[0] += 1.0  # two steps
    bar.update(2)
    with Loop.bar_paused(types.SimpleNamespace(bar=bar)):
        now[0] += 30.0  # an evaluation
    assert bar.format_dict["elapsed"] == pytest.approx(1.0)
    bar.update(2)
    bar.close()


def test_the_loss_plot_leaves_the_callers_matplotlib_backend_alone(tmp_path):
    """A run called from a notebook ends with loss.png and the notebook keeps its backend (the plot
    switched every caller to Agg)."""
    import matplotlib

    from bertkit.training.log import plot_losses
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        records = [{"step": s, "loss": 1 / s} for s in range(1, 40)] + [{"step": 39, "eval_loss": 0.2}]
        plot_losses(records, tmp_path / "loss.png", [("loss", "train"), ("eval_loss", "eval")], "a run")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
