"""The kernel: errors, durations, the message envelope, ids, crypto.

Imports nothing else of haze.
"""
