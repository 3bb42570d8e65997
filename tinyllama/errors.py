"""The errors every benchmark (TinyLLaMA's and the inference benchmark's) raises for what a
participant can fix: the command lines print them as one line, without a traceback."""


class BenchmarkError(RuntimeError):
    """A benchmark that cannot run as asked; the message says what to change."""


class ConfigError(BenchmarkError, ValueError):
    """A bad setting, found before anything is built."""
