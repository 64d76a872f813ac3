"""SQS's limits, the sqs driver's token on a received message (``SqsReceipt``), and the
fields the driver rewrites in a body it sends again."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from haze._base.deps import require

#: SQS's message size limit (1 MiB since August 2025), also the send_message_batch total.
SQS_MAX_MESSAGE_SIZE = 1_048_576
#: The longest ``DelaySeconds`` SQS accepts.
SQS_MAX_DELAY = 900
#: The longest a message can stay invisible (visibility timeout), in seconds.
SQS_MAX_VISIBILITY = 43_200
#: The longest ``WaitTimeSeconds`` of one long poll.
SQS_MAX_WAIT = 20
_BATCH = 10
#: A failure the failed store could not keep is sent back after 10 s, then 20 s, 40 s,
#: ... (up to SQS's 15 minutes), 8 times at most; then the record is reported, and
#: the queue's redrive policy takes over.
_HAND_BACK_DELAY = 10
_MAX_HANDED_BACK = 8
#: The most of the error text a sent-back message carries (it counts toward its size).
_UNRECORDED_TEXT = 8 * 1024
#: Seconds kept back from the 12-hour visibility limit (clock skew, call latency).
_VISIBILITY_MARGIN = 60
#: Bytes of the size limit kept free at dispatch for what the driver may add to a body
#: later: ``,"attempts":NNNNN`` and ``,"meta":{"due":NNNNNNNNNN.NNN}`` (a release, a
#: retry re-sent past 12 h, a delay over 15 minutes).
_HEADROOM = 48
#: A message this close to its ``due`` time counts as due (SQS delays are whole seconds).
_DUE_TOLERANCE = 1.0
_SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "SentTimestamp",
    "ApproximateFirstReceiveTimestamp",
    "MessageGroupId",
]
_NO_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_BAD_RECEIPT = {
    "ReceiptHandleIsInvalid",
    "InvalidParameterValue",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
}


def _boto3() -> Any:
    return require("boto3", what="the sqs driver", extra="sqs")


def _error_code(error: BaseException) -> str:
    """SQS's error code of a botocore ``ClientError`` ("" for any other error)."""
    client_error = importlib.import_module("botocore.exceptions").ClientError
    if isinstance(error, client_error):
        return str((error.response.get("Error") or {}).get("Code") or "")
    return ""


@dataclass(slots=True)
class SqsReceipt:
    """The driver's token on a received message (``Reserved.token``)."""

    url: str
    handle: str
    message_id: str
    receive_count: int
    sent_at: float
    first_received_at: float
    group: str | None = None
    #: Receives of this message that ran nothing (a FIFO trigger's records reported
    #: unprocessed): not attempts. Kept by the Lambda handler in the app's store.
    unused: int = 0


#: What SQS takes as a MessageGroupId: 1 to 128 printable ASCII characters, no space.
_GROUP_ID = re.compile(r"[!-~]{1,128}")


def _group_id(group: str) -> str:
    """``group`` as a MessageGroupId; a ValueError (before any call) for one SQS refuses."""
    if not _GROUP_ID.fullmatch(group):
        raise ValueError(
            f"on_group: {group[:40]!r}{'…' if len(group) > 40 else ''} ({len(group)} "
            "characters) cannot be an SQS MessageGroupId, which is 1 to 128 printable ASCII "
            "characters without spaces (letters, digits and punctuation); use an id such as "
            "'customer-42' (nothing was enqueued)"
        )
    return group
