# Shared fixtures live in tests/support; register them once for every test module.
pytest_plugins = [
    "tests.support.https",
    "tests.support.kube_scope",
    "tests.support.control_plane.fault_proxy",
]
