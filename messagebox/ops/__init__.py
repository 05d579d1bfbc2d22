"""What an operator reads and steers: ``operations.Operations`` (queues,
statistics, suspended entries, tracking, cleanup), orchestration instances,
browsing, search, failure groups, resubmission, scheduled entries, the
console's users and their passwords, and the ``MessageBox`` mixins over them.
The top of the storage layer: above ``config``, ``delivery``, ``routing`` and
``storage``.
"""
