"""Print the browser test's summary line at the end of the run (pytest captures what tests print)."""


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    line = getattr(config, "book_browser_summary", None)
    if line:
        terminalreporter.write_line(line)
