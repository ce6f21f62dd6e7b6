"""The web dashboard of ``kubectl koord-queue dashboard`` (docs/dashboard.md): a local server
inside the plugin process that answers with the plugin's own commands, as the user who started it."""
