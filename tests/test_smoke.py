def test_import():
    import shoprld.daemon, shoprld.states  # noqa
