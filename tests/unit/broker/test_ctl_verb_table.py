"""``leveret ctl``'s verb table (broker/tools/ctl/commands.py): a group of verbs enters by one line in
``GROUPS``, so the table itself must refuse what a careless line could do (a verb declared by two groups),
and a group's options hook must reach the parser with its verbs. The verbs' behaviour against a broker is
tested in tests/integration/management/test_ctl.py and test_ctl_operator_verbs.py."""

from __future__ import annotations

import argparse

import pytest

from broker.tools.ctl.api import Api
from broker.tools.ctl.commands import GROUPS, VERBS, build_parser, verb_table
from broker.tools.ctl.verb import Verb, VerbGroup


def _import(api: Api, args: argparse.Namespace) -> str:
    return f"importing from {args.source_url}"


def _source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source-url", default=None)


NEW_GROUP = VerbGroup({"import_from_elsewhere": Verb(_import)}, add_options=_source_options)


def test_a_verb_declared_by_two_groups_is_refused():
    clash = VerbGroup({"list_queues": Verb(_import)})
    with pytest.raises(ValueError, match="list_queues is declared twice"):
        verb_table((*GROUPS, clash))


def test_a_new_group_brings_its_verbs_and_its_options_to_the_parser():
    parser = build_parser((*GROUPS, NEW_GROUP))
    # Options before or after the verb, as for every other verb.
    args = parser.parse_intermixed_args(["-p", "/v", "import_from_elsewhere", "--source-url", "http://r:15672"])
    assert (args.verb, args.vhost, args.source_url) == ("import_from_elsewhere", "/v", "http://r:15672")
    assert "import_from_elsewhere" in parser.format_help()
    # ...and only there: ctl's own parser does not know it.
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_intermixed_args(["import_from_elsewhere"])
    assert exit_.value.code == 64


def test_every_verb_is_a_choice_of_the_parser_in_the_table_order():
    choices = next(a.choices for a in build_parser()._actions if a.dest == "verb")
    assert list(choices) == list(VERBS)
    assert len(VERBS) == sum(len(g.verbs) for g in GROUPS)
