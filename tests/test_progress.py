"""The progress bar where stderr is a file or a pipe: whole lines, at most one per interval."""
import io

from bertkit.training.log import _Lines, progress_bar


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_redraws_become_one_line_per_interval_and_the_last_state_is_kept():
    out, clock = io.StringIO(), Clock()
    lines = _Lines(out, every=30, clock=clock)
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
