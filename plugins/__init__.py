"""narrmem's built-in plugins. Each registers through the ``narrmem`` entry-point group, exactly
as a third-party plugin does."""
