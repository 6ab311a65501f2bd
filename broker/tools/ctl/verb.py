"""What a verb is to ctl's command table: a function of the API and the parsed command line to the text it
prints, and whether that text is only rabbitmqctl's informational line (``-q`` prints nothing then); and what
a group of verbs gives the table — its verbs and, if it has any, the options only its verbs read."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from broker.tools.ctl.api import Api

VerbFunction = Callable[[Api, argparse.Namespace], str]


def no_options(parser: argparse.ArgumentParser) -> None:
    """The options hook of a group whose verbs read only ctl's common options."""


@dataclass(frozen=True, slots=True)
class Verb:
    """``run`` answers the text to print; ``only_banner``: that text is the "Adding user ..." line alone,
    which ``-q`` drops. A verb whose output is data leaves it False and handles ``-q`` itself (leaving out
    its banner, keeping its rows)."""

    run: VerbFunction
    only_banner: bool = False


@dataclass(frozen=True, slots=True)
class VerbGroup:
    """A module's verbs, by name, in the order ``leveret ctl --help`` lists them, and the hook that adds the
    options only they read to ctl's parser (an option's name must not be one ctl or another group has)."""

    verbs: Mapping[str, Verb]
    add_options: Callable[[argparse.ArgumentParser], None] = field(default=no_options)

