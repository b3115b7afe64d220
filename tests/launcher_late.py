"""A module the warm launcher of tests/test_launcher.py imports only once it is idle."""
