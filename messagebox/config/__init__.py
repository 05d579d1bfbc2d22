"""What routes where: hosts and subscriptions one at a time (``catalog.Catalog``)
or as code (``configs.Configs``: the routing file, plans, lint, type traps,
applied versions; ``as_code``, the ``MessageBox`` mixin). Above ``storage``.
"""
