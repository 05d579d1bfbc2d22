"""Host applications that tests run in separate processes."""
