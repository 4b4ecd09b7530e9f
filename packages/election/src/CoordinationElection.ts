/**
 * The fenced election recipe on any `Coordination` backend (docs/ARCHITECTURE.md, "Election and failover"):
 * ephemeral-sequential candidates, the lowest leads after verifying it owns
 * that node, the epoch node is bumped with a versioned compare-and-set, and the
 * leader registers an ephemeral leader node in a transaction that checks the
 * epoch it wrote. Every other candidate watches only its predecessor.
 *
 * Building the election validates its options (`CoordinationElectionOptions`):
 * the namespace must make a path, the durations must be durations above zero,
 * and the session (liveness) timeout the backend negotiated must be shorter
 * than `replicaLagTimeMax`.
 *
 * @since 0.1.0
 */
import { type Coordination, Election } from "@strata/core"
import { Config, Context, Effect, Layer, type Scope } from "effect"
import * as internal from "./internal/election.js"

/** Options of the election, validated by `make` (a bad one fails with `InvalidElectionOptions` naming it). */
export const CoordinationElectionOptions = internal.Options
/** @see CoordinationElectionOptions */
export type CoordinationElectionOptions = internal.Options

/**
 * The election's metrics (attribute `namespace`): `strata_coordinator_elections_total`,
 * `strata_coordinator_election_duration_seconds` (histogram, key `electionDuration`),
 * `strata_coordinator_fenced_writes_rejected_total`
 * and `strata_coordinator_candidate_wakeups_total` (predecessor watches fired).
 */
export const metrics = internal.metrics

/** The `CoordinationElection` service key; its layer also provides `Election`. */
export class CoordinationElection extends Context.Service<CoordinationElection, Election.Shape>()(
  "@strata/election/CoordinationElection"
) {}

/**
 * Builds the election. Opens one long-lived observer session in the scope (for
 * `leader`, `changes` and epoch reads, reopened when it expires); every
 * campaign opens its own session. Fails with `InvalidElectionOptions` (naming
 * the option and its value) when the options cannot work.
 */
export const make = (
  options: CoordinationElectionOptions
): Effect.Effect<Election.Shape, Election.ElectionError, Coordination.Coordination | Scope.Scope> =>
  internal.make(options)

/** The election as a layer providing both `CoordinationElection` and `Election`. */
export const layer = (
  options: CoordinationElectionOptions
): Layer.Layer<CoordinationElection | Election.Election, Election.ElectionError, Coordination.Coordination> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(CoordinationElection, service).pipe(Context.add(Election.Election, service))
    )
  )

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<CoordinationElectionOptions>
): Layer.Layer<
  CoordinationElection | Election.Election,
  Election.ElectionError | Config.ConfigError,
  Coordination.Coordination
> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
