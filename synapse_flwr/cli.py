"""The ``synapse`` command line: build, validate, merge, inspect and route compendia."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Column, Table

from synapse_flwr.core.errors import SynapseError
from synapse_flwr.core.privacy import DEFAULT_DELTA, DEFAULT_EPSILON, MAX_DELTA
from synapse_flwr.core.wire import ArtifactError
from synapse_flwr.flower.config import BY_NAME

log = logging.getLogger("synapse_flwr")

app = typer.Typer(
    name="synapse",
    help="Typed federated tool-routing compendia: build one org's artifact from its "
    "experience, validate and merge artifacts, inspect them, route queries, run the "
    "federation, and run the experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
MAX_WINDOWS = BY_NAME["max-windows"].default  # a build's cap is the Flower client's

NoiseSeedOption = Annotated[int | None, typer.Option(
    help="Seed of the noise, for reproducible experiments only: anyone who knows it can regenerate the noise "
         "and remove it. Default: a secret seed from the OS's random source, never written down.")]
OutOption = Annotated[
    Path, typer.Option("--output", "-o", help="Output file (written atomically; '.gz' compresses).")
]
ReleaseCacheOption = Annotated[Path | None, typer.Option(
    help="This organisation's release cache: a JSON file on its own disk, never sent, that records which "
         "records were released (and voted). With it each record is released once across builds: a later build "
         "of a grown log releases a window of the new records (noise alone when none is new, so that what is sent "
         "does not show whether records arrived) and re-sends the rest at no further cost. A cache made under "
         "other settings (org, epsilon, delta, rounds, embedder, --no-votes) is refused, not replaced.")]


def check_output(output: Path, inputs: list[Path], option: str = "--output", adds: bool = False) -> None:
    """Refuse, before any work, an output that is a folder, one of the command's inputs, cannot be written, or
    would replace a file kept for itself (:func:`_kept_file`).

    Parameters
    ----------
    output : Path
        The file the command will write.
    inputs : list of Path
        The files it reads.
    option : str
        The option that named ``output``, for the message.
    adds : bool
        The command adds to ``output`` (keygen's registry) rather than replacing it.
    """
    from synapse_flwr.core.files import write_problem

    if output.is_dir():
        raise SynapseError(f"{option} {output} is a folder; name a file to write")
    # compared whether or not they exist yet: keygen's registry named as its own new key file passed
    if any(p.resolve() == output.resolve() for p in inputs):
        raise SynapseError(f"{option} {output} is one of the inputs; writing it would destroy that input")
    if problem := write_problem(output):  # a parent that is a file, a read-only folder: said now, not after the work
        raise SynapseError(f"{option} {output} {problem}")
    if not adds and output.is_file() and (kind := _kept_file(output)):
        raise SynapseError(f"{option} {output} is {kind}; writing over it would lose it: name another file")


def _kept_file(path: Path) -> str | None:
    """What ``path`` holds when it is a file no command's output may replace, or None.

    An organisation's release cache (its ledger: replaced, its records would be
    released again), a key or key registry, a log or test set (JSONL).
    """
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        return "a JSONL file (a log or a test set)"
    if path.suffix == ".key":
        return "a private key"
    with path.open("rb") as handle:
        head = handle.read(256)
    if head.startswith(b'{"fingerprint":'):
        return "a release cache (the organisation's ledger of released records)"
    if b'"synapse-keys/' in head:
        return "a key registry"
    return None


def check_folder(folder: Path, what: str) -> None:
    """Refuse, before any work, a folder to write into that is a file or cannot be created or written.

    ``what`` names it in the message (``--dir keys``, ``the log's folder data``).
    """
    from synapse_flwr.core.files import write_problem

    if problem := write_problem(folder, folder=True):
        raise SynapseError(f"{what} {problem}")


def check_org(org: str, what: str = "--org", reserved: bool = False) -> None:
    """Refuse, before any work, an organisation id the artifact's schema would refuse (``schema.OrgId``).

    ``reserved``: the server's own id passes too (a key's owner may be the server; no key is the global's).
    """
    from synapse_flwr.core.schema import org_id_problem
    from synapse_flwr.core.signing import SERVER

    if (problem := org_id_problem(org)) and not (reserved and org == SERVER):
        raise SynapseError(f"{what} {org!r}: {problem}")


def _noise_seed(seed: int | None, epsilon: float, records: list[str]) -> int:
    """The noise's seed: a secret one, or with ``seed`` one derived from it and the records' keys (a warning when
    it seeds a private release).

    Derived from the records too, so that two logs differing by one record draw independent noise: with one
    noise for both, the difference of their artifacts showed that record's exact counts to anyone holding the
    two, seed or not. The same log and seed still give the same artifact.
    """
    from synapse_flwr.core.builder import derive_seed

    if seed is None:
        return secrets.randbits(63)
    if math.isfinite(epsilon):
        log.warning("--seed %d seeds the noise: whoever knows it can remove the noise, so this release is "
                    "private only from those who do not; leave --seed out for a secret seed", seed)
    return derive_seed(seed, hashlib.sha256("\n".join(records).encode()).hexdigest())


def check_space(embedder: str, none: bool = True) -> None:
    """Refuse, before any work, an embedder that cannot name a space shared by the federation (``SPACES``).

    ``none``: whether ``none`` (no prototypes) is one; a vote routes its records, so it needs a space.
    """
    from synapse_flwr.flower.config import SPACES

    spaces = [s for s in SPACES if none or s != "none"]
    if embedder not in spaces:
        raise SynapseError(f"--embedder {embedder!r}: use one of {' | '.join(spaces)} (tfidf is fitted per "
                           "corpus, so organisations' prototypes could not share its space)")


def check_budget(epsilon: float, delta: float) -> None:
    """Refuse, before the log loads, a budget no noise meets: an epsilon not > 0, a delta outside (0, MAX_DELTA]."""
    from synapse_flwr.core.privacy import PrivacyParams, gaussian_noise_multiplier

    if not 0 < delta <= MAX_DELTA:  # (a NaN fails it too)
        raise SynapseError(f"--delta must be in (0, {MAX_DELTA:g}], as a federation's, got {delta!r}")
    try:
        PrivacyParams(epsilon=epsilon, delta=delta, rounds=1, max_contributions=1)
        if math.isfinite(epsilon):  # the calibration depends on epsilon and delta only, not on the releases
            gaussian_noise_multiplier(epsilon, delta, 1)
    except ValueError as exc:
        raise SynapseError(f"--epsilon {epsilon!r} with --delta {delta!r}: {exc}") from None


def check_model(model: str, option: str = "--model") -> None:
    """Refuse, before any model loads, a ``local/`` model that is not one of the embedded ones, and a call timeout
    (``SYNAPSE_LLM_TIMEOUT``) that is no number of seconds.

    Any other string names a hosted litellm model, which only its provider can check.
    """
    # imported here: it imports litellm, for an LLM only
    from synapse_flwr.core.llm import LOCAL_MODELS, call_timeout

    call_timeout()  # an LLMError, a SynapseError: said in one line
    if not model.startswith("local/"):
        return
    if model.removeprefix("local/") not in LOCAL_MODELS:
        raise SynapseError(f"{option} {model!r}: unknown local model; valid: "
                           + ", ".join(f"local/{n}" for n in sorted(LOCAL_MODELS)) + ", or a hosted litellm model "
                           "such as gpt-4o")


def _own_or_warning(record: logging.LogRecord) -> bool:
    """Keep libraries' records below WARNING (faiss' optional AVX-512 import at INFO, ...) out of the log."""
    return record.levelno >= logging.WARNING or record.name.startswith("synapse_flwr")


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging, libraries' records included "
                                          "(a flag: -v, it takes no value).")] = False,
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_own_or_warning)
        # transformers' "Loading weights" bar, here and in the Flower processes a command starts
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@app.command()
def build(
    experience: Annotated[Path, typer.Option(help="Experience log (JSONL): one routing event a line.")],
    catalog: Annotated[Path, typer.Option(help="Tool catalog (JSON list or JSONL; plain, OpenAI or MCP shape).")],
    org: Annotated[str, typer.Option(help="This organisation's id (written into the issuer block).")],
    output: OutOption,
    epsilon: Annotated[
        float, typer.Option(help="Privacy budget per record over the whole run, > 0; 'inf' turns privacy off.")
    ] = DEFAULT_EPSILON,
    delta: Annotated[float, typer.Option(help=f"Privacy delta per record over the whole run, in (0, {MAX_DELTA:g}] "
                                         "(accounting + phrase selection).")] = DEFAULT_DELTA,
    rounds: Annotated[
        int, typer.Option(min=1, help="Releases one record may take part in (1: released once).")
    ] = 1,
    releases: Annotated[
        int, typer.Option(min=1, help="Releases a record has taken part in, this one included.")
    ] = 1,
    round_: Annotated[
        int, typer.Option("--round", min=0, help="Server round written into the issuer (0: standalone).")
    ] = 0,
    seed: NoiseSeedOption = None,
    embedder: Annotated[
        str, typer.Option(help="Embedding space of the query prototypes, shared by the federation: "
                          "minilm | mpnet | static | none (none: no prototypes).")
    ] = "minilm",
    summarise_model: Annotated[
        str | None,
        typer.Option(help="litellm model that rewrites released scenario phrases into a line "
                     "(off by default; it only sees already-privatised phrases)."),
    ] = None,
    votes: Annotated[
        bool, typer.Option(help="Keep a share of each record's budget for its fusion vote, cast later with "
                           "`synapse vote` against the merged global (without it, the records cannot vote).")
    ] = True,
    release_cache: ReleaseCacheOption = None,
    max_windows: Annotated[int, typer.Option(
        min=1, help="With --release-cache: most windows the cache releases. Each adds its noise to the re-sent "
                    "release, records or not; past them a build re-sends the cache and releases nothing new "
                    "(as a Flower client does under the run config's max-windows).")] = MAX_WINDOWS,
) -> None:
    """Build this organisation's privatised typed compendium from its experience.

    Without --release-cache every build releases every record of the log
    again, with fresh noise: two builds of one log spend the budget twice.
    """
    from synapse_flwr.core.builder import BuildConfig, build_compendium, window_seed
    from synapse_flwr.core.catalog import load_catalog, size_problem
    from synapse_flwr.core.embed import get_embedder
    from synapse_flwr.core.experience import load_experience
    from synapse_flwr.core.release import logged_keys
    from synapse_flwr.core.schema import Compendium
    from synapse_flwr.core.votes import VOTE_SHARE
    from synapse_flwr.core.wire import content_hash, encode, save_artifact

    if summarise_model:
        from synapse_flwr.core.llm import scenario_rewriter

    check_org(org)
    check_space(embedder)
    check_budget(epsilon, delta)
    if summarise_model:
        check_model(summarise_model, "--summarise-model")
    check_output(output, [experience, catalog])
    if release_cache is not None:
        _check_cache(release_cache, [output, experience, catalog])
        if releases != 1:
            raise SynapseError("--releases counts a record's releases by hand; --release-cache counts them itself "
                               "(each record once): leave --releases at 1")
    elif max_windows != MAX_WINDOWS:
        log.warning("--max-windows %d is ignored without --release-cache: it bounds the windows a cache releases",
                    max_windows)
    t0 = time.perf_counter()
    cat = load_catalog(catalog)
    if too_large := size_problem(cat):  # before the log and the embedder load
        raise SynapseError(f"{catalog}: {too_large}")
    events = load_experience(experience, cat)
    log.info("loaded %d events over %d catalog tools", len(events), len(cat))
    if not events:
        log.warning("%s holds no events: the artifact will carry the catalog's documentation and nothing "
                    "learned from experience", experience)
    try:
        config = BuildConfig(rewrite=scenario_rewriter(summarise_model) if summarise_model else None,
                             vote_share=VOTE_SHARE if votes and embedder != "none" else 0.0)
        keys = logged_keys(experience) if seed is not None or release_cache is not None else []  # (a second read)
        space, noise = None if embedder == "none" else get_embedder(embedder), _noise_seed(seed, epsilon, keys)

        def make(window: list, windows_before: int = 0) -> Compendium:
            return build_compendium(window, cat, org, round_=round_, epsilon=epsilon, delta=delta, rounds=rounds,
                                    releases=releases, seed=window_seed(noise, windows_before), config=config,
                                    embedder=space)

        comp = make(events) if release_cache is None else _release_once(
            release_cache, events, keys, cat, org,
            {"epsilon": epsilon, "delta": delta, "rounds": rounds, "embedder": embedder}, make, round_,
            math.isfinite(epsilon) and not config.vote_share, max_windows)
    except ValueError as exc:
        raise SynapseError(str(exc)) from None
    save_artifact(output, comp)
    raw, packed = len(encode(comp, compress=False)), len(encode(comp))
    eps = comp.privacy.epsilon
    log.info(
        "wrote %s: %d tools, %d scenarios, %s bytes raw / %s gzip, epsilon %s, sha256 %s (%.2fs)",
        output,
        len(comp.tools),
        sum(len(t.when) + len(t.when_not) for t in comp.tools),
        f"{raw:,}",
        f"{packed:,}",
        "off" if eps is None else f"{eps:.3f}",
        content_hash(comp)[:12],
        time.perf_counter() - t0,
    )
    _log_prototypes_read(comp)


def _check_cache(cache: Path, files: list[Path]) -> None:
    """Refuse, before any work, a release cache that is a folder, one of the command's other files, or unwritable."""
    from synapse_flwr.core.files import write_problem

    if cache.is_dir():
        raise SynapseError(f"--release-cache {cache} is a folder; name the organisation's cache file")
    if any(p.resolve() == cache.resolve() for p in files):
        raise SynapseError(f"--release-cache {cache} is one of the command's other files; give the cache its own")
    if problem := write_problem(cache):
        raise SynapseError(f"--release-cache {cache} {problem}")


def _release_once(cache: Path, events: list, keys: list[str], catalog, org: str, settings: dict, make, round_: int,
                  drop_votes: bool, max_windows: int):
    """The artifact to write: the cache's release plus a window of the records it has not released.

    Every build releases a window, noise alone when no record is new: whether
    records arrived must not show in what is sent. A cache holding
    ``max_windows`` windows releases no more (each window adds its noise to the
    release, so builds of an unchanged log would bury it): the cache is re-sent.

    ``make(window, windows_before)`` builds a window (each window draws its own
    noise, :func:`~synapse_flwr.core.builder.window_seed`). The cache is saved
    first, holding the artifact as written: a failure after it leaves records
    marked released whose release the next build re-sends, never records
    released twice.
    """
    from synapse_flwr.core.release import (
        load_release_state,
        release_round,
        release_settings,
        save_release_state,
        without_votes,
    )

    state = load_release_state(cache, release_settings(org, {"command": "build", **settings}), pinned=True)
    cached = state.artifact.privacy if state.artifact is not None else None
    # windows with and without a vote share in one cache: the combined artifact takes the block without it, so the
    # records that paid for a vote could never cast it (read off the cached release: caches of any age)
    if cached is not None and cached.mechanism != "none" and (cached.vote_share <= 0) != drop_votes:
        kind = "with a vote share" if drop_votes else "without a vote share (build --no-votes)"
        fix = "without --no-votes" if drop_votes else "with --no-votes"
        raise SynapseError(f"release cache {cache} holds releases built {kind}; build this one {fix} too, or give "
                           "it a cache of its own")
    due = state.windows < max_windows  # looks at the windows only, never at the records
    comp, new, released = release_round(list(zip(keys, events)), state, lambda window: make(window, state.windows),
                                        round_, catalog, due=due)
    if drop_votes:
        new = without_votes(state, new)
    save_release_state(cache, new.model_copy(update={"artifact": comp}))
    if not due:
        waiting = len(set(keys) - set(state.released))
        log.warning("%s holds %d release windows (--max-windows %d): no window released, the cached release is "
                    "re-sent; %d records of the log are not released and will not be", cache, state.windows,
                    max_windows, waiting)
        return comp
    log.info("%s: %d records released now; %d released before, re-sent at no further cost", cache, released,
             len(state.released))
    if not released and state.artifact is not None:
        log.info("no record was new: the window added holds noise alone (a build releases one whatever the log "
                 "holds, so that what is sent does not show whether records arrived)")
    return comp


def _log_prototypes_read(comp) -> None:
    """Say how many of a private artifact's prototypes clear the noise, and warn when none does."""
    if comp.privacy.mechanism == "none" or not any(t.prototype for t in comp.tools):
        return
    read = sum(_above_noise(comp).values())
    log.info("prototypes above the noise (length and count tests): %d of %d tools; a router reads those "
             "that also point along their tool's documentation", read, len(comp.tools))
    if not read:
        log.warning("at epsilon %s no prototype clears the noise: this artifact routes as the documentation "
                    "alone; more experience per tool, or a larger epsilon, would change that",
                    comp.privacy.epsilon_target)


@app.command()
def vote(
    experience: Annotated[Path, typer.Option(help="This organisation's experience log: the one --artifact was "
                                             "built from (each of its records votes once).")],
    catalog: Annotated[Path, typer.Option(help="Tool catalog the federation uses.")],
    artifact: Annotated[Path, typer.Option(help="This organisation's artifact from `synapse build`.")],
    global_: Annotated[Path, typer.Option("--global", help="The global `synapse merge` made from --artifact "
                                          "and the other organisations' artifacts.")],
    output: OutOption,
    embedder: Annotated[str, typer.Option(help="Embedder of the global's prototype space "
                                          "(the one --artifact was built with): minilm, mpnet or static.")
                        ] = "minilm",
    seed: NoiseSeedOption = None,
    release_cache: Annotated[Path | None, typer.Option(
        help="The release cache --artifact was built with (`build --release-cache`): then only its records "
             "that were released and have not voted vote, and the cache records their votes, so that the next "
             "build re-sends them. Without it, an artifact votes once.")] = None,
) -> None:
    """Cast this organisation's fusion votes: how much a router of the global should trust experience.

    Each record of --experience is routed against --global, taken out of it,
    under a few settings from documentation alone to the full weight of
    experience; the noised counts of right routes are added to --artifact,
    paid from the share of each record's budget that `build` kept for them.
    Then merge every organisation's voted artifact again: a router of that
    global follows the setting the votes favour, and routes exactly as the
    documentation does where experience does not beat it by more than the
    noise. (A Flower federation casts these votes itself, in each round's vote phase.)
    """
    import numpy as np

    from synapse_flwr.core.builder import artifact_vote_noise, derive_seed
    from synapse_flwr.core.catalog import load_catalog
    from synapse_flwr.core.embed import get_embedder
    from synapse_flwr.core.experience import event_label, load_experience
    from synapse_flwr.core.prototypes import space_mismatch
    from synapse_flwr.core.release import (
        cast_votes,
        logged_keys,
        may_vote,
        vote_refusal,
    )
    from synapse_flwr.core.votes import SETTINGS, chosen_setting
    from synapse_flwr.core.wire import content_hash

    check_space(embedder, none=False)
    check_output(output, [experience, catalog, artifact, global_])
    if release_cache is not None:
        _check_cache(release_cache, [output, experience, catalog, artifact, global_])
    own, merged = (_load_artifact(path) for path in (artifact, global_))
    state = None if release_cache is None else _cached_release(release_cache, own, artifact)
    reason = vote_refusal(own, merged, counted=state is not None)
    if reason is None:
        try:  # a cache's records were released once each
            sd, epsilon = artifact_vote_noise(own.privacy, None if state is None else 1)
        except ValueError as exc:
            reason = str(exc)
    if reason:
        raise SynapseError(f"{artifact} cannot vote against {global_}: {reason}")
    cat = load_catalog(catalog)
    events = load_experience(experience, cat)
    keys = logged_keys(experience)
    if state is not None:
        waiting = may_vote(state, keys)
        events, keys = [e for e, ok in zip(events, waiting) if ok], [k for k, ok in zip(keys, waiting) if ok]
        log.info("%s: %d records of %s released and not voted yet", release_cache, len(keys), experience)
    if not any(event_label(e, cat) is not None for e in events):
        unvoted = "that was released and has not voted " if state else ""
        what = f"{experience} holds no record with a catalog tool {unvoted}"
        if not sd:  # without privacy nothing is released for nobody
            raise SynapseError(f"{what}to vote with")
        # under privacy the vote goes out as noise alone: a vote sent only when some record had a label would say so
        log.warning("%sto vote with: the votes released are noise alone", what)
    emb = get_embedder(embedder)
    if mismatch := space_mismatch(merged.embedding, emb):
        raise SynapseError(f"--embedder {embedder}: {mismatch}")
    # each vote its own noise, even under one --seed: the same noise in two votes would cancel in their difference
    rng = np.random.default_rng(derive_seed(_noise_seed(seed, epsilon or math.inf, keys),
                                            own.issuer.org, "votes", content_hash(own)))
    log.info("routing %d records against %s, each left out of it, under %d settings", len(events), global_,
             len(SETTINGS))
    cast = cast_votes(events, cat, merged, emb, sd, rng)
    _save_votes(output, own, state, release_cache, cast, list(keys), epsilon, experience, artifact)
    # the count this organisation knows; the released one is noised (it read -2 for 5 records)
    voted = sum(event_label(e, cat) is not None for e in events)
    log.info("wrote %s: %d records voted (released as %.0f, noise SD %.1f), %s; alone, these votes favour %s. "
             "Merge every organisation's voted artifact into the next global.", output, voted, cast.records, cast.sd,
             "privacy off" if epsilon is None else f"epsilon spent {epsilon:.3f} of {own.privacy.epsilon_target:g}",
             _setting_words(chosen_setting(cast)))


def _cached_release(cache: Path, own, artifact: Path):
    """The release cache ``--artifact`` came from; refused when missing, unreadable, or holding another release."""
    from synapse_flwr.core.release import read_release_state
    from synapse_flwr.core.wire import content_hash

    try:
        state = read_release_state(cache)
    except FileNotFoundError:
        raise SynapseError(f"--release-cache {cache} does not exist: name the cache `build` wrote") from None
    if state.artifact is None or content_hash(state.artifact) != content_hash(own):
        raise SynapseError(f"{artifact} is not the release {cache} holds: vote with the artifact the last build "
                           "with this cache wrote")
    return state


def _save_votes(output: Path, own, state, cache: Path | None, cast, keys: list[str], epsilon: float | None,
                experience: Path, artifact: Path) -> None:
    """Write the voted artifact; with a cache, the cache first (its records' votes, the voted artifact)."""
    from synapse_flwr.core.release import add_votes, save_release_state, with_votes
    from synapse_flwr.core.schema import Compendium
    from synapse_flwr.core.wire import save_artifact

    try:
        voted = Compendium.model_validate(add_votes(own, cast, epsilon).model_dump())
    except ValueError as exc:
        raise SynapseError(f"the votes do not fit {artifact} ({exc}): is {experience} the log it was built "
                           "from?") from None
    if state is not None and cache is not None:
        save_release_state(cache, with_votes(own, state, cast, keys, epsilon)[1].model_copy(update={"artifact": voted}))
    save_artifact(output, voted)


def _setting_words(setting) -> str:
    """A fusion setting (:func:`~synapse_flwr.core.votes.chosen_setting`'s, of votes that exist) in words."""
    if setting.prototype == setting.prior == 0:
        return "the documentation alone"
    return f"prototype weight {setting.prototype:g}, count prior {setting.prior:g}"


def _load_artifact(path: Path):
    """The artifact at ``path``; an invalid one is named with the reason."""
    from synapse_flwr.core.wire import load_artifact

    if path.is_file() and path.stat().st_size == 0:  # else "Expecting value: line 1 column 1", which hides it
        raise SynapseError(f"{path} is empty (0 bytes): not an artifact")
    try:
        return load_artifact(path)
    except ArtifactError as exc:
        raise SynapseError(f"{path} is not a valid artifact: {exc}") from None


@app.command()
def validate(files: Annotated[list[Path], typer.Argument(help="Artifacts to check.")]) -> None:
    """Check artifacts against the schema: exit 0 if all are valid, 1 otherwise.

    Prints one line per error, naming the file and the field path.
    """
    from synapse_flwr.core.wire import load_artifact

    bad = 0
    for path in files:
        try:
            load_artifact(path)
        except ArtifactError as exc:
            bad += 1
            for line in exc.errors:
                typer.echo(f"{path}: {line}")
        else:
            typer.echo(f"{path}: valid")
    raise typer.Exit(1 if bad else 0)


@app.command()
def keygen(
    owner: Annotated[str, typer.Argument(help="Org id, or 'server' for the server's key.")],
    key_dir: Annotated[Path, typer.Option("--dir", help="Folder of the private key <owner>.key.")] = Path("keys"),
    registry: Annotated[
        Path | None, typer.Option(help="Public-key registry to add the key to (default: <dir>/keys.json).")
    ] = None,
    replace: Annotated[
        bool, typer.Option(help="Rotate: overwrite <owner>.key and drop the owner's older public keys.")
    ] = False,
) -> None:
    """Make an Ed25519 key pair: the private key to <dir>/<owner>.key (mode 600), the public one into the registry.

    Prints the key id and the files, never the key.
    """
    from synapse_flwr.core.signing import add_to_registry, new_signer, save_private_key

    check_org(owner, "owner", reserved=True)
    check_folder(key_dir, f"--dir {key_dir}")
    key_path, reg_path = key_dir / f"{owner}.key", registry or key_dir / "keys.json"
    if key_path.exists() and not replace:
        raise SynapseError(f"{key_path} exists; pass --replace to rotate the key of {owner!r}")
    check_output(reg_path, [key_path], "--registry", adds=True)
    _check_registry(reg_path)  # before the key is written: a bad registry must not leave a key behind
    signer = new_signer(owner)
    save_private_key(key_path, signer)
    try:
        reg = add_to_registry(reg_path, signer, replace=replace)
    except SynapseError:
        if not replace:  # a key no registry knows would only make the rerun ask for --replace
            key_path.unlink(missing_ok=True)
        raise
    typer.echo(f"{owner}: key {signer.key_id} -> {key_path} (private), {reg_path} "
               f"({sum(o == owner for o, _ in reg.keys.values())} registered for {owner})")


def _check_registry(path: Path) -> None:
    """Refuse, before any key is made, a registry file that is not one ``keygen`` could add to.

    A missing file is fine (keygen creates it); a JSON error names its line
    and column, a wrong shape the entry (:func:`~synapse_flwr.core.signing.load_registry`).
    """
    from synapse_flwr.core.errors import InputError
    from synapse_flwr.core.files import read_problem
    from synapse_flwr.core.signing import load_registry

    if not path.exists():
        return
    try:
        text = path.read_text("utf-8")
        json.loads(text)
    except json.JSONDecodeError as exc:
        problem = "is empty" if not text.strip() else f"not valid JSON: {exc.msg} (column {exc.colno})"
        raise InputError(path, f"{problem}; --registry takes a keys file `synapse keygen` wrote",
                         line=None if not text.strip() else exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, read_problem(exc)) from None
    load_registry(path)


@app.command("check-data")
def check_data(folder: Annotated[Path, typer.Argument(help="Dataset folder: catalog.json, org_*.jsonl, test.jsonl.")]) -> None:
    """Check a dataset folder: every file, field and tool id; exit 0 if valid, 2 otherwise.

    Prints one line per problem, naming the file, line and field, with the fix
    where one is known. With a test set it also says what an experiment will
    score: test queries on tools with and without experience, and the training
    events the leak filter leaves out (an organisation it empties is named).
    """
    from synapse_flwr.data.check import TEST_FILE, DataError, require_valid
    from synapse_flwr.data.federation import load_folder, split_summary

    if folder.is_file():
        raise SynapseError(f"{folder} is a file; check-data reads a dataset folder (e.g. {folder.parent})")
    try:
        report = require_valid(folder)
    except DataError as exc:
        typer.echo(exc.listing)
        raise typer.Exit(2) from None
    typer.echo(f"valid: {report.summary()}")
    if (folder / TEST_FILE).is_file():  # what an experiment will score, after the leak filter it applies
        typer.echo(split_summary(load_folder(folder, report=report)))
    else:  # valid for simulate and build, but an experiment scores a test set
        typer.echo(f"note: no {TEST_FILE}: `synapse experiment` needs one (JSONL of query and gold, "
                   "docs/formats.md); `synapse simulate` and `build` do not")


@app.command("split-orgs")
def split_orgs(
    log_file: Annotated[Path, typer.Argument(help="Labelled experience log (e.g. FOLDER/train.jsonl).")],
    orgs: Annotated[int, typer.Option(min=1, help="Organisations (org_org0.jsonl ...).")] = 5,
    alpha: Annotated[
        float | None, typer.Option(help="Dirichlet concentration of a non-IID split over tools (default: IID).")
    ] = None,
    # min: numpy's generators refuse a negative seed, in a traceback
    seed: Annotated[int, typer.Option(min=0, help="Shuffle / partition seed.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Folder of the org logs (default: beside the log).")] = None,
    overwrite: Annotated[bool, typer.Option(
        help="Replace existing logs: every org_*.jsonl in the folder is removed first, so it holds this split alone."
    )] = False,
) -> None:
    """Split one labelled log into organisation logs, IID or Dirichlet non-IID."""
    from synapse_flwr.data.split import split_orgs as split

    if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
        raise SynapseError(f"--alpha must be a finite number > 0 (smaller: more skewed), got {alpha}; omit it "
                           "for an IID split")
    check_folder(out or log_file.parent, f"--out {out}" if out else f"the log's folder {log_file.parent}")
    for org, path in split(log_file, orgs, alpha, seed, out, overwrite).items():
        typer.echo(f"{org}: {path}")


@app.command()
def examples(
    dataset: Annotated[str, typer.Argument(help="A dataset folder (its catalog.json), or demo, metatool, taubench.")],
    model: Annotated[str, typer.Option(help="litellm model that writes the requests: local/smollm2 or e.g. gpt-4o.")]
    = "local/smollm2",
    per_tool: Annotated[int, typer.Option(help="Requests sampled per tool (unusable ones are dropped).")] = 6,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    out: Annotated[
        Path | None, typer.Option(help="Where to write the table (default: examples.json beside a folder's catalog).")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Write example requests for every tool, from the catalog's names and descriptions alone.

    The requests are public text (nothing private is read) that every router
    reading the catalog adds to a tool's documentation vector, docs_only
    included; examples.json beside a catalog is read with it. With
    local/smollm2 on 2 idle CPU cores the model takes about 25 s to load,
    then about 5 s a tool (several times longer while other work shares the
    cores); a hosted model (any litellm model string) is asked for 8 tools at
    once.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from synapse_flwr.core.catalog import EXAMPLES_FILE, load_catalog
    from synapse_flwr.core.examples import generate_examples
    from synapse_flwr.core.files import write_atomic
    from synapse_flwr.data.check import catalog_file
    from synapse_flwr.data.federation import load_dataset

    if per_tool < 1:
        raise SynapseError(f"--per-tool must be at least 1, got {per_tool}")
    if out is None:
        if not Path(dataset).is_dir():
            raise SynapseError(f"{dataset!r} is not a folder: name the table to write with --out")
        out = Path(dataset) / EXAMPLES_FILE
    path = catalog_file(Path(dataset)) if Path(dataset).is_dir() else None
    if Path(dataset).is_dir() and path is None:
        raise SynapseError(f"{dataset} holds no catalog.json or catalog.jsonl")
    check_output(out, [path] if path else [], "--out")  # before the model loads, which takes a minute
    if out.exists() and not overwrite:
        raise SynapseError(f"{out} exists; pass --overwrite to replace it")
    check_model(model)
    # the table beside the catalog is what this command (re)writes: it is not read, so a broken one is replaced
    catalog = load_catalog(path, examples=False) if path else load_dataset(dataset).catalog
    columns = (TextColumn("examples"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("examples", total=len(catalog))
        table = generate_examples(catalog, model, per_tool, seed,
                                  progress=lambda done, _: bar.update(task, completed=done))
    write_atomic(out, json.dumps(table, indent=1, ensure_ascii=False) + "\n")
    empty = sum(not v for v in table.values())
    log.info("wrote %s: %d requests for %d tools (%d tools got none)", out, sum(map(len, table.values())),
             len(table), empty)
    if empty > len(table) / 2:
        log.warning("most tools got no usable request from %s (refusals, preambles or empty replies are left out): "
                    "read a few of its replies with -v before you use %s", model, out)


@app.command()
def merge(
    files: Annotated[list[Path], typer.Argument(help="Validated artifacts to merge.")],
    output: OutOption,
    policy: Annotated[
        str, typer.Option(help="Merge policy: typed, support-weighted, robust or flat-majority.")
    ] = "typed",
) -> None:
    """Merge artifacts into one global compendium with the chosen policy."""
    from synapse_flwr.core.merge import POLICIES
    from synapse_flwr.core.merge import merge as merge_artifacts
    from synapse_flwr.core.schema import FlatCompendium
    from synapse_flwr.core.wire import content_hash, save_artifact

    if policy not in POLICIES:
        raise SynapseError(f"unknown merge policy {policy!r}; choose one of {', '.join(POLICIES)}")
    check_output(output, files)
    t0 = time.perf_counter()
    artifacts = [_load_artifact(path) for path in files]
    flat = [a for a in artifacts if isinstance(a, FlatCompendium)]
    if flat and policy != "flat-majority":
        raise SynapseError(f"{len(flat)} flat artifact(s) can only be merged with --policy flat-majority")
    hashes = [content_hash(a) for a in artifacts]
    _check_one_per_org(files, artifacts, hashes)
    distinct = _warn_merge_inputs(files, artifacts, hashes)
    try:
        merged = merge_artifacts(artifacts, policy)
    except ValueError as exc:  # e.g. prototypes from two embedding spaces
        raise SynapseError(f"cannot merge these artifacts: {exc}") from None
    save_artifact(output, merged)
    conflicts = len(getattr(merged, "conflicts", []))
    log.info(
        "merged %d artifact%s%s with the %s policy into %s (%d conflicts, %.2fs)",
        distinct, "" if distinct == 1 else "s", f" from {len(files)} files" if distinct < len(files) else "", policy,
        output, conflicts, time.perf_counter() - t0,
    )
    _log_votes_step(output, artifacts, merged)


def _log_votes_step(output: Path, artifacts: list, merged) -> None:
    """Say what the global's fusion votes decide, or how to cast them when the inputs kept a share for them."""
    from synapse_flwr.core.votes import chosen_setting

    voted = [a for a in artifacts if getattr(a, "votes", None) is not None]
    if voted:
        log.info("fusion votes of %.0f records from %d of %d artifacts: a router of %s follows %s",
                 merged.votes.records, len(voted), len(artifacts), output, _setting_words(chosen_setting(merged.votes)))
    elif any(getattr(a.privacy, "vote_share", 0) > 0 for a in artifacts) and any(
            getattr(t, "prototype", None) for t in getattr(merged, "tools", [])):
        log.info("next: each organisation runs `synapse vote --artifact ITS_ARTIFACT --global %s ...` and the "
                 "voted artifacts are merged again; until then a router adds experience at the default weights, "
                 "which can route below the documentation alone on data unlike MetaTool", output)


def _check_one_per_org(files: list[Path], artifacts: list, hashes: list[str]) -> None:
    """Refuse two different inputs that hold one organisation's records: two builds of its log, an artifact and its
    voted copy, a global and an artifact of one of its organisations, two globals sharing one.

    Merged together its records would count twice, with twice its weight; a
    Flower round keeps one artifact per organisation. An artifact a global
    input already contains is merged once (``merge.unique_inputs``) and passes;
    a global names its organisations (``orgs``; one written before it did is
    not checked). ``hashes``: each artifact's content hash.
    """
    from synapse_flwr.core.merge import input_orgs
    from synapse_flwr.core.schema import Compendium

    contained = {h for a in artifacts if a.kind == "global" for h in getattr(a, "inputs", ())}
    first: dict[str, tuple[str, Path]] = {}
    for path, art, digest in zip(files, artifacts, hashes):
        if digest in contained or not isinstance(art, Compendium):  # a flat global names no orgs
            continue
        for org in input_orgs([art]):
            other_digest, other = first.setdefault(org, (digest, path))
            if other_digest != digest:
                raise SynapseError(f"{other} and {path} both hold records of organisation {org!r}: merged together "
                                   "they would count twice; merge one artifact per organisation (its latest, or "
                                   "the copy `synapse vote` wrote), or the organisations' artifacts instead of "
                                   "a global that holds one of them")


def _warn_merge_inputs(files: list[Path], artifacts: list, hashes: list[str]) -> int:
    """Say what a merge quietly does with repeated inputs and with private and non-private ones mixed.

    ``hashes``: each artifact's content hash. Returns the number of distinct artifacts, each merged once.
    """
    seen: dict[str, Path] = {}
    for path, digest in zip(files, hashes):
        first = seen.setdefault(digest, path)
        if first is not path:
            log.warning("%s is the same artifact as %s: it is merged once", path, first)
    mechanisms = {getattr(getattr(a, "privacy", None), "mechanism", None) for a in artifacts} - {None}
    if "none" in mechanisms and len(mechanisms) > 1:
        log.warning("private and non-private artifacts are mixed: the global's privacy block says 'none', "
                    "and the non-private inputs carry no guarantee")
    return len(seen)


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file instead of stdout "
                                                "('.gz' compresses, as every -o does).")] = None,
) -> None:
    """Print the JSON Schema of the compendium (generated from the pydantic models)."""
    import gzip

    from synapse_flwr.core.files import write_atomic
    from synapse_flwr.core.schema import json_schema

    if output:
        check_output(output, [])
    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if output:  # (it wrote plain JSON under a '.gz' name)
        write_atomic(output, gzip.compress(text.encode(), mtime=0) if output.suffix == ".gz" else text)
    else:
        typer.echo(text, nl=False)


#: The fewest terminal columns ``synapse inspect`` shows a top scenario in (else it leaves the column out).
INSPECT_SCENARIO_WIDTH = 24
INSPECT_WRAP = 24  # the orgs column wraps at this width


@app.command()
def inspect(
    file: Annotated[Path, typer.Argument(help="An artifact.")],
    limit: Annotated[int, typer.Option(min=0, help="Show at most this many tools (those with experience above the "
                                        "noise first, then by calls).")] = 30,
) -> None:
    """Summarise an artifact: issuer, privacy, size, and a table of its tools."""
    from synapse_flwr.core.router import NOISE_SDS, calls_floor
    from synapse_flwr.core.schema import FlatCompendium
    from synapse_flwr.core.wire import content_hash, encode

    art = _load_artifact(file)
    console = Console()
    p = art.privacy
    eps = "off" if p.epsilon is None else f"{p.epsilon:.3f} of {p.epsilon_target}"
    console.print(
        f"[bold]{file}[/bold]: {art.kind} artifact from {art.issuer.org}, round {art.issuer.round}"
        + (f", policy {art.policy}" if art.policy else "")
    )
    console.print(
        f"privacy: {p.mechanism}, epsilon {eps}, delta {p.delta:g}, sigma {p.sigma:.3f}, "
        f"release threshold {p.threshold:.2f}, text {p.text_policy}"
    )
    console.print(
        f"size: {len(encode(art, compress=False)):,} bytes raw, {len(encode(art)):,} gzip; "
        f"sha256 {content_hash(art)}"
    )
    if isinstance(art, FlatCompendium):
        table = Table("tool", "flat text (start)")
        for tool_id, text in list(art.texts.items())[:limit]:
            table.add_row(tool_id, text[:100])
        console.print(table)
        return
    console.print(f"tools: {len(art.tools)}, conflicts: {len(art.conflicts)}")
    if art.votes is not None:
        console.print(_votes_line(art.votes))
    above = _above_noise(art)
    read = {tool: f"{art.tool(tool).prototype.count:.0f}" + (" *" if m else "") for tool, m in above.items()}
    floor = calls_floor(art)
    # tools with evidence above the noise first (calls, or a prototype the router may read): a private global's
    # unused tools read 40-70 noised calls and were listed among the most used; a count within the noise is marked ~
    ranked = sorted(art.tools, key=lambda t: (t.stats.calls <= floor and not above.get(t.tool_id, False),
                                              -t.stats.calls, t.tool_id))[:limit]
    # the tool's id whole (up to 40 columns) and the short columns unbroken: the orgs wrap, and the scenario is cut
    # to one line (wrapped into a narrow terminal's last columns it read one word per line)
    widest = min(40, max([4, *(len(t.tool_id) for t in ranked)]))
    # (each short column at least its header's width: a long scenario squeezed them to nothing at 100-140 columns)
    columns = [Column("tool", no_wrap=True, min_width=widest),
               *(Column(h, no_wrap=True, min_width=len(h)) for h in ("when/not/prec", "calls", "success", "prototype")),
               Column("orgs", min_width=4, max_width=INSPECT_WRAP),
               Column("top scenario", no_wrap=True, overflow="ellipsis")]
    rows = [[t.tool_id, f"{len(t.when)}/{len(t.when_not)}/{len(t.precautions)}",
             f"{t.stats.calls:.0f}" + (" ~" if floor and t.stats.calls <= floor else ""),
             "-" if t.stats.success_rate is None or t.stats.calls <= floor else f"{t.stats.success_rate:.0%}",
             read.get(t.tool_id, "-"),
             ",".join(t.provenance.orgs), max(t.when, key=lambda s: s.support).text if t.when else ""]
            for t in ranked]
    # the orgs and the top scenario only where some tool has them (a private global names an org only where
    # its noised release shows experience of the tool: post-processing of that release)
    optional = ("orgs", "top scenario")
    shown = [i for i, c in enumerate(columns) if c.header not in optional or any(row[i] for row in rows)]
    if shown[-1] == len(columns) - 1:  # the scenario takes what the others leave (else rich squeezes them to nothing)
        # each column's widest cell, the orgs counted at most as wide as they wrap, plus its borders and padding
        rest = 4 + sum(min(max(len(columns[i].header), *(len(row[i]) for row in rows)),
                           INSPECT_WRAP if columns[i].header == "orgs" else console.width) + 3 for i in shown[:-1])
        columns[-1].max_width = console.width - rest
        if columns[-1].max_width < INSPECT_SCENARIO_WIDTH:
            shown.pop()  # no room beside the other columns: a wider terminal shows it
            console.print(f"(top scenario column left out: the terminal is {console.width} columns wide, "
                          f"it needs {rest + INSPECT_SCENARIO_WIDTH})")
    table = Table(*(columns[i] for i in shown))
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    console.print(table)
    if floor:
        console.print(f"calls: noised; ~ at or below {floor:.0f}, where a tool nobody called reads {NOISE_SDS:g} noise "
                      f"SDs aside: no evidence of use ({sum(t.stats.calls <= floor for t in art.tools)} of "
                      f"{len(art.tools)} tools; listed after the others unless their prototype is above the noise)")
    if read:
        console.print(f"prototype: its released query count; * above the noise (length and count tests): "
                      f"{sum(m.endswith('*') for m in read.values())} of {len(read)} tools. A router reads those "
                      "that also point along their tool's documentation.")
    if art.conflicts:
        ctable = Table("tool", "field", "subject", "claims", "resolution")
        for c in art.conflicts[:limit]:
            claims = "; ".join(f"{cl.view} {cl.support:g} ({','.join(cl.orgs)})" for cl in c.claims)
            ctable.add_row(c.tool_id, c.field, c.subject, claims, c.resolution)
        console.print(ctable)


def _above_noise(art) -> dict[str, bool]:
    """Per tool with a prototype, whether it clears the router's noise tests (length and count)."""
    from synapse_flwr.core.fusion import Fusion
    from synapse_flwr.core.prototypes import readable

    tools = [t for t in art.tools if t.prototype is not None]
    gate = Fusion()
    return dict(zip([t.tool_id for t in tools],
                    readable([t.prototype for t in tools], gate.gate_alpha, gate.gate_count_sds)))


def _votes_line(votes) -> str:
    """One line on a compendium's fusion votes: voters, right routes per setting, the setting a router follows."""
    from synapse_flwr.core.votes import chosen_setting

    chosen = chosen_setting(votes)
    # noised counts, and their share of the noised voters while that count is positive (noise can put it at 0 or below)
    share = ", ".join(f"({s.prototype:g}, {s.prior:g}) {c:,.0f}"
                      + (f" ({c / votes.records:.1%})" if votes.records > 0 else "")
                      for s, c in zip(votes.settings, votes.correct))
    return (f"fusion votes: {votes.records:,.0f} voters (noise SD {votes.sd:.1f}); right routes by (prototype, "
            f"prior): {share}; a router routes with ({chosen.prototype:g}, {chosen.prior:g})")


LLMWeightOption = Annotated[
    float | None,
    typer.Option(help="Weight of the LLM's score for --reranker llm, beside each candidate's standing (retrieval's; "
                 "for a tool without experience for the query the better of that and the documentation's; 0: "
                 "order by standing alone). Default: the model's "
                 "weight chosen on MetaTool's dev split, 0.5 for a model never measured; choose it on your own "
                 "dev split."),
]

ModelOption = Annotated[
    str | None,
    typer.Option(help="litellm model for --reranker llm: local/smollm2 (the default) or a hosted one, e.g. gpt-4o."),
]

EmbedderOption = Annotated[
    str | None,
    typer.Option(help="Embedder of queries and documentation: minilm, mpnet, static or tfidf. Default: the "
                 "compendium's embedding space (its query prototypes are read only in it), else minilm; another "
                 "space than a compendium's prototypes is refused."),
]

ShiftTestOption = Annotated[bool, typer.Option(
    "--shift-test/--no-shift-test",
    help="Run the query-shift test (the default): while the queries sit far from the federation's, route them on "
         "the documentation alone, as docs_only does (docs/experiments.md, \"Query shift\"). --no-shift-test keeps "
         "reading experience: for traffic known to be like the federation's but terser (keyword queries sit far "
         "from every prototype for want of words).")]
CountPriorOption = Annotated[
    float | None,
    typer.Option(help="Weight of log(1 + n) for each tool whose query prototype the router reads, n the "
                 "prototype's released query count: a prior that your traffic follows the federation's mix of "
                 "tools (default: the one the federation's fusion votes chose, else the embedder's dev-split "
                 "value: 0.5 for minilm and mpnet, 0.2 for static). Set 0 when your traffic's mix differs, e.g. a "
                 "test set balanced over tools (docs/results/tuning/label_shift)."),
]


@app.command()
def route(
    query: Annotated[list[str] | None, typer.Argument(help="The request(s) to route.")] = None,
    catalog: Annotated[Path, typer.Option(help="Tool catalog (JSON list or JSONL).")] = ...,
    compendium: Annotated[
        Path | None, typer.Option(help="Global (or org) compendium; omit to route on docs alone.")
    ] = None,
    reranker: Annotated[str, typer.Option(help="fields (typed scorer), llm or none (retrieval top-1).")] = "fields",
    model: ModelOption = None,
    embedder: EmbedderOption = None,
    render: Annotated[str, typer.Option(
        help="typed: read the compendium's fields; flat (the paper's ablation): each tool's entry becomes one "
             "documentation string, which retrieval and the reranker read, and its query prototypes are not "
             "read.")] = "typed",
    k: Annotated[int, typer.Option(min=1, help="Candidates retrieved per query (plus the tool a matching "
                                            "when_not names instead, when it was not among them).")] = 5,
    explain: Annotated[bool, typer.Option(help="Print which field decided and each candidate's evidence.")] = False,
    llm_weight: LLMWeightOption = None,
    count_prior: CountPriorOption = None,
    shift_test: ShiftTestOption = True,
    test: Annotated[Path | None, typer.Option(
        help="A test set to route and score instead of QUERY (a query and its gold tool a line, as a dataset "
             "folder's test.jsonl): one JSON line per query with its gold, then top-1 and recall@k.")] = None,
) -> None:
    """Route queries to tools and print one JSON result per query (or score a test set: --test).

    When the queries given sit far from the federation's own (20 or more
    whose documentation-best tool has experience, on average far from its
    prototypes), they are routed on the documentation alone, as docs_only
    routes them, and each result says so (`experience_off`; docs/experiments.md,
    "Query shift").
    """
    from synapse_flwr.core.catalog import load_catalog
    from synapse_flwr.core.experience import load_testset
    from synapse_flwr.core.explain import explain_route
    from synapse_flwr.core.metrics import evaluate_routes
    from synapse_flwr.core.router import query_problem, request_text

    if bool(query) == (test is not None):
        raise SynapseError("give the requests to route as arguments, or a test set with --test (not both)")
    items = load_testset(test, load_catalog(catalog)) if test is not None else []  # before the models load
    if test is not None and not items:
        raise SynapseError(f"--test {test} holds no test items (a query and its gold tool a line): nothing to score")
    queries = [request_text(q) for q in query or []] or [item.query for item in items]  # (test items are cut as read)
    if bad := [(i, problem) for i, q in enumerate(queries, start=1) if (problem := query_problem(q))]:
        raise SynapseError(f"query {bad[0][0]} of {len(queries)} {bad[0][1]}: nothing to route")
    router = _load_router(catalog, compendium, reranker, model, embedder, render, k, llm_weight, count_prior,
                          None if shift_test else 0)
    before = _llm_counts(reranker)
    results = router.route_many(queries, remember=test is not None)  # a test set is scored again, a request not
    asked = _llm_counts(reranker) - before
    for i, result in enumerate(results):
        # golds in the catalog's spelling beside their ids, as `tool` and `tool_id` are (ids alone matched no `tool`)
        gold = [router.names.get(g, g) for g in items[i].gold] if items else []
        if explain:
            typer.echo(explain_route(result, router.names) + (f"\ngold: {', '.join(gold)}" if items else ""))
        elif items:
            typer.echo(json.dumps({**result.to_dict(router.names), "gold": gold, "gold_ids": list(items[i].gold)},
                                  ensure_ascii=False))
        else:
            typer.echo(json.dumps(result.to_dict(router.names), indent=2, ensure_ascii=False))
    if fell_back := sum(r.fallback for r in results):
        log.warning("%d of %d queries fell back to retrieval order: the LLM gave no usable answer (see the "
                    "warnings above); their routes are retrieval's, not the LLM's", fell_back, len(results))
    if asked["parse_failures"]:  # a query falls back only when all its calls fail: these are the rest
        log.warning("%d of %d LLM calls got a reply that named no single candidate (counted as no preference)",
                    asked["parse_failures"], asked["hosted_calls"])
    if items:
        scores = evaluate_routes(results, [item.gold for item in items], k)
        log.info("%s: top-1 %.3f, recall@%d %.3f over %d queries", test, scores["acc"], k, scores["r5"], len(items))


def _llm_counts(reranker: str) -> Counter:
    """A copy of the hosted LLM calls' counters (``llm.SCORE_STATS``: calls, replies that named no candidate);
    empty without the LLM reranker (litellm is then not imported)."""
    if reranker != "llm":
        return Counter()
    from synapse_flwr.core.llm import SCORE_STATS

    return Counter(SCORE_STATS)


TRANSPORTS = ("stdio", "sse", "streamable-http")


def _loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


@app.command()
def serve(
    catalog: Annotated[Path, typer.Option(help="Tool catalog (JSON list or JSONL).")],
    compendium: Annotated[
        Path | None, typer.Option(help="Global compendium; omit to route on docs alone.")
    ] = None,
    reranker: Annotated[str, typer.Option(help="fields, llm or none.")] = "fields",
    model: ModelOption = None,
    embedder: EmbedderOption = None,
    transport: Annotated[str, typer.Option(help="MCP transport: stdio, sse or streamable-http.")] = "stdio",
    host: Annotated[str | None, typer.Option(help="Address an HTTP transport listens on (default 127.0.0.1: "
                                             "this machine only).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port of an HTTP transport (default 8000); "
                                             "streamable-http answers at /mcp, sse at /sse.")] = None,
    llm_weight: LLMWeightOption = None,
    count_prior: CountPriorOption = None,
    shift_test: ShiftTestOption = True,
) -> None:
    """Serve routing to agents as an MCP server with one tool, `route`.

    While the last 1,000 requests whose documentation-best tool has
    experience sit far from the federation's queries, requests are routed on
    the documentation alone, as docs_only routes them (each result says so:
    `experience_off`; docs/experiments.md, "Query shift").
    """
    from synapse_flwr.core.embed import uncached
    from synapse_flwr.core.shift import SERVE_WINDOW
    from synapse_flwr.serve import build_server, check_listen

    if transport not in TRANSPORTS:
        raise SynapseError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    listen = {}
    if transport != "stdio":
        listen = {"host": host or "127.0.0.1", "port": port or 8000}
        check_listen(**listen)
        if not _loopback(listen["host"]):
            log.warning("--host %s: the MCP endpoint has no authentication and is reachable from the network; "
                        "serve on 127.0.0.1 behind an authenticating proxy unless every host that reaches it may "
                        "use it", listen["host"])
    elif host is not None or port is not None:
        raise SynapseError("--host and --port apply to --transport sse or streamable-http, not stdio")
    router = _load_router(catalog, compendium, reranker, model, embedder, "typed", 5, llm_weight, count_prior,
                          SERVE_WINDOW if shift_test else 0)
    # the models load now, not in the first request (an index read from the cache never loaded the embedder; an
    # embedded LLM whose wheel is missing would fail every request of a server that started)
    uncached(router.embedder).encode(["warm up"])
    if router.reranker == "llm" and router.model.startswith("local/"):
        from synapse_flwr.core.llm import load_local_model

        load_local_model(router.model.removeprefix("local/"))
    log.info("serving %d tools over %s%s", len(router.tool_ids), transport,
             f" at http://{listen['host']}:{listen['port']}" if listen else "")
    build_server(router).run(transport=transport, **listen)


AppDirOption = Annotated[
    Path | None,
    typer.Option(help="The Flower app: a folder with its pyproject.toml (default: the synapse-flwr checkout this "
                 "package runs from, else the working folder)."),
]
SetOption = Annotated[
    list[str],
    typer.Option("--set", help="Run-config override KEY=VALUE (TOML value), repeatable: "
                 "--set epsilon=inf --set policy='flat-majority'."),
]


def check_timeout(timeout: float) -> None:
    """Refuse, before anything starts, a --timeout that is not a finite number of seconds > 0."""
    if not (math.isfinite(timeout) and timeout > 0):
        raise SynapseError(f"--timeout must be a finite number of seconds > 0, got {timeout}")


def _log_run_table(output_dir: Path) -> None:
    """Log the server's per-round table from ``metrics.json`` (the ServerApp prints it only to its own log)."""
    from synapse_flwr.flower.launch import read_metrics
    from synapse_flwr.flower.server_app import summary_table

    rounds = read_metrics(output_dir)
    if rounds:
        log.info("per round:\n%s", summary_table(rounds))
        if not rounds[-1].get("merged", True):
            log.warning("the last round merged nothing (global 'kept'): the final global is an earlier round's")


@app.command()
def simulate(
    app_dir: AppDirOption = None,
    nodes: Annotated[int, typer.Option(min=1, help="Simulated organisations (SuperNodes).")] = 3,
    set_: SetOption = [],
    flwr_home: Annotated[Path | None, typer.Option(help="Flower home (default: a new temp folder).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds (> 0) before the run is abandoned.")] = 900.0,
) -> None:
    """Run the federation under Flower's Ray simulation engine, isolated, and clean up after."""
    from synapse_flwr.flower.launch import (
        default_app_dir,
        parse_overrides,
        run_simulation,
    )

    check_timeout(timeout)
    res = run_simulation(app_dir or default_app_dir(), nodes, parse_overrides(set_), flwr_home, timeout)
    _log_run_table(res.output_dir)
    log.info("run %s %s in %.1fs; outputs in %s (log: %s)", res.run_id, res.status, res.wall_s,
             res.output_dir, res.log_path)


@app.command("deploy-local")
def deploy_local(
    app_dir: AppDirOption = None,
    nodes: Annotated[int, typer.Option(min=1, help="SuperNodes, one per organisation of the dataset.")] = 3,
    node: Annotated[
        list[str], typer.Option(help="ORG=DATA_PATH of one SuperNode, repeatable (overrides --nodes).")
    ] = [],
    catalog: Annotated[Path | None, typer.Option(help="Catalog for --node experience files.")] = None,
    set_: SetOption = [],
    flwr_home: Annotated[Path | None, typer.Option(help="Flower home (default: a new temp folder).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds (> 0) before the run is abandoned.")] = 900.0,
) -> None:
    """Start a real SuperLink and SuperNodes on 127.0.0.1, run the federation, shut all down."""
    from synapse_flwr.flower.deploy import (
        DeploymentConfig,
        parse_node,
        run_local_deployment,
    )
    from synapse_flwr.flower.launch import default_app_dir, parse_overrides

    check_timeout(timeout)
    if catalog is not None and not node:
        raise SynapseError(f"--catalog {catalog} is the catalog of --node experience files; without --node the "
                           "nodes read the run config's dataset (--set dataset=...)")
    specs = [parse_node(n, catalog) for n in node] or nodes
    cfg = DeploymentConfig(app_dir=app_dir or default_app_dir(), nodes=specs, run_config=parse_overrides(set_),
                           flwr_home=flwr_home, timeout=timeout)
    res = run_local_deployment(cfg)
    _log_run_table(res.output_dir)
    log.info("run %s %s in %.1fs on nodes %s; outputs in %s (log: %s)", res.run_id, res.status,
             res.wall_s, res.node_ids, res.output_dir, res.log_path)


@app.command()
def experiment(
    config: Annotated[Path, typer.Argument(
        help="Experiment TOML with an 'experiment' table (see configs/), or a dataset folder.")],
    fresh: Annotated[bool, typer.Option(help="Ignore and delete the cache; recompute every unit.")] = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Results folder (default: the config's 'output', else "
                                  "docs/results/NAME under the working folder; the cache: runs/experiments/NAME).")
    ] = None,
) -> None:
    """Run an experiment (arms x seeds x contradiction rates) and write its results folder.

    CONFIG is a TOML file with an "experiment" table; for a dataset folder of
    your own one line is enough: dataset = "/path/to/folder" (every other key
    has a default: 3 seeds, the folder's organisations, epsilon 4, every arm;
    docs/experiments.md lists them), and the folder itself may stand for that
    line: synapse experiment /path/to/folder. Every unit of work (a Flower
    simulation, a build, an evaluation) is cached under the config's 'cache'
    folder: an interrupted run resumes where it stopped. Writes results.json,
    tables.md, manifest.json and PNG figures, and ends with a summary in the
    log.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from synapse_flwr.simulations.experiment import run_experiment

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[unit]}"))
    bar = Progress(*columns, console=Console(stderr=True), transient=False)

    def start(total: int) -> None:  # once the config and its data passed every check
        bar.start()
        bar.add_task("experiment", total=total, unit="")

    def advance(label: str) -> None:
        done = bar.tasks[0].completed + 1
        bar.update(bar.task_ids[0], advance=1, unit=label, total=max(bar.tasks[0].total or 0, done))

    try:
        out = run_experiment(config, fresh, output, advance, start)
        bar.update(bar.task_ids[0], total=bar.tasks[0].completed)  # the estimate becomes the count that ran
    finally:
        bar.stop()
    log.info("wrote %s", out.resolve())


def _check_router_options(reranker: str, model: str | None, llm_weight: float | None,
                           count_prior: float | None) -> None:
    """Refuse, before anything loads, the router's weights out of range and a misspelt local model, by option.

    Options that only the LLM reranker reads are named when another reranker would silently ignore them.
    """
    if llm_weight is not None and not 0 <= llm_weight < math.inf:  # inf * a zero score is NaN, which argmax picks
        raise SynapseError(f"--llm-weight must be a finite number >= 0, got {llm_weight}")
    if count_prior is not None and not (math.isfinite(count_prior) and count_prior >= 0):
        raise SynapseError(f"--count-prior must be a finite number >= 0, got {count_prior}")
    if reranker == "llm":
        check_model(model or "local/smollm2")
        return
    ignored = [name for name, value in (("--model", model), ("--llm-weight", llm_weight)) if value is not None]
    if ignored:
        log.warning("%s apply only to --reranker llm: --reranker %s ignores them", " and ".join(ignored), reranker)


def _router_embedder(comp, embedder: str | None):
    """The router's embedder: ``--embedder``, else the compendium's space, else minilm.

    A compendium's query prototypes are read only in their own space: an
    ``--embedder`` of another space is refused, as ``vote`` refuses it,
    rather than routing on the documentation alone with a warning.
    """
    from synapse_flwr.core.embed import get_embedder, space_embedder
    from synapse_flwr.core.prototypes import space_mismatch

    has_prototypes = any(getattr(e, "prototype", None) for e in getattr(comp, "tools", []))
    space = getattr(comp, "embedding", None) if has_prototypes else None
    emb = get_embedder(embedder or (space and space_embedder(space.model)) or "minilm")
    if embedder is not None and space is not None and (mismatch := space_mismatch(space, emb)):
        raise SynapseError(f"--embedder {embedder}: {mismatch}; leave --embedder out to route in the "
                           "compendium's space")
    return emb


def _load_router(catalog, compendium, reranker, model, embedder, render, k, llm_weight, count_prior,
                 shift_window: int | None = None):
    from dataclasses import replace

    from synapse_flwr.core.catalog import load_catalog
    from synapse_flwr.core.fusion import voted_fusion
    from synapse_flwr.core.router import (
        DOCS_CANDIDATES,
        Router,
        check_router_args,
    )
    from synapse_flwr.core.schema import FlatCompendium
    from synapse_flwr.core.shift import WINDOW
    from synapse_flwr.core.votes import chosen_setting

    _check_router_options(reranker, model, llm_weight, count_prior)
    model = model or "local/smollm2"
    try:  # before loading anything: a misspelt model or reranker is named at once
        check_router_args(reranker, k, render, model, "auto", llm_weight, DOCS_CANDIDATES)
    except ValueError as exc:
        raise SynapseError(str(exc)) from None
    cat = load_catalog(catalog)
    comp = None
    if compendium is not None:
        comp = _load_artifact(compendium)
        held = set(comp.texts) if isinstance(comp, FlatCompendium) else {e.tool_id for e in comp.tools}
        missing = sorted(held - set(cat.ids))
        if missing:
            log.warning("%d of the compendium's %d tools are not in %s (%s%s): nothing routes to them; is this "
                        "the catalog the federation used?", len(missing), len(held), catalog,
                        ", ".join(missing[:3]), ", ..." if len(missing) > 3 else "")
    try:  # before the line below says experience is added: a space the prototypes are not in is refused
        emb = _router_embedder(comp, embedder)
    except ValueError as exc:  # an unknown embedder
        raise SynapseError(str(exc)) from None
    if comp is not None and chosen_setting(getattr(comp, "votes", None)) is None and count_prior is None and any(
            getattr(e, "prototype", None) for e in getattr(comp, "tools", [])):
        log.info("%s carries no fusion votes (a federation casts them in each round's vote phase; `synapse vote` "
                 "casts them for artifacts merged by hand): experience is added at the default weights, chosen "
                 "on MetaTool; a voted global weighs it for its own data",
                 compendium)
    try:
        fusion = None if count_prior is None else replace(voted_fusion(comp, emb.name), prior=count_prior)
        return Router(comp, cat, embedder=emb, reranker=reranker, k=k, render=render, model=model,
                      llm_weight=llm_weight, fusion=fusion, shift_window=WINDOW if shift_window is None else shift_window)
    except ValueError as exc:
        raise SynapseError(str(exc)) from None


def main() -> None:
    """Entry point: user mistakes end with a one-line error and exit code 2, not a traceback.

    A SIGTERM stops a command as Ctrl-C does, tearing down any Flower
    processes it started.
    """
    from synapse_flwr.flower.processes import interrupt_on_sigterm

    interrupt_on_sigterm()
    try:
        app()
    except SynapseError as exc:
        log.error("%s", exc)
        sys.exit(2)
