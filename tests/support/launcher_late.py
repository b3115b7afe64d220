"""A module the warm launcher of tests/infra/services/test_launcher.py imports only once it is idle."""
