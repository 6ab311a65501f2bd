"""ctl's ``import_from_rabbitmq`` verb in the verb table: broker/tools/migrate_rabbitmq.py's move in from a
RabbitMQ (definitions through its management API, one on-confirm shovel per non-empty queue), given ctl's
resolved Leveret (:class:`~broker.tools.ctl.api.Api` satisfies its ``LeveretTarget``) and ctl's error class."""

from __future__ import annotations

from broker.tools import migrate_rabbitmq
from broker.tools.ctl.errors import CtlError
from broker.tools.ctl.verb import Verb, VerbGroup

GROUP = VerbGroup({migrate_rabbitmq.VERB: Verb(migrate_rabbitmq.verb(CtlError))},
                  add_options=migrate_rabbitmq.add_arguments)
