"""Registers the test markers (the lead may move these to setup.cfg / pytest.ini)."""


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long-running test, excluded from the quick suite")
  config.addinivalue_line("markers", "tpu_only: needs a TPU backend")
  config.addinivalue_line("markers", "gpu_only: needs a GPU backend")
