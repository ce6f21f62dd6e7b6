"""koord-queue-py: one import name for the whole product (docs/development.md#one-import-root).

The design fixes the repository's top level (``shared/``, ``webhook/``, ``reconciler/``,
``certs/``), so in the repository the subpackages here are links to those folders; an installed
wheel holds real copies. Import them only through this name (``koord_queue.shared...``): a unit
test refuses the bare folder names, which would load a second copy of the same module.
``koord_queue.cli`` is the kubectl plugin, the one part that installs without the servers'
dependencies.
"""
