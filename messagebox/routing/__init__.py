"""Messages in: publishing (``publishing.Messages``, one transaction a call:
publish, explain, read stored messages), the router and what a publish writes,
convoys, receipts and publish throttling. Above ``storage``.
"""
