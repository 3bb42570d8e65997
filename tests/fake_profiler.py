"""A stand-in for ``torch.profiler.profile`` holding hand-made events: what ``ProfileRun`` reads of a
real profile (``events()`` and ``key_averages()``), for tests of attribution on a GPU's profile
without a GPU."""


class FakeProfiler:
    def __init__(self, events, averages):
        self._events, self._averages = events, averages

    def events(self):
        return self._events

    def key_averages(self, group_by_input_shape=False):
        return self._averages
