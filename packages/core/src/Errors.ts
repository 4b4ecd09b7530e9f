/**
 * Error reasons shared by several protocols. Each protocol has its own error
 * class (`StoreError`, `LogError`, ...) whose `reason` is a tagged union; the
 * reasons below appear in more than one of those unions.
 *
 * @since 0.1.0
 */
import * as Models from "./Models.js"
import { Schema } from "effect"

/** A read or seek at an offset outside `[logStart, highwater]`. Never silently reset. */
export class OffsetOutOfRange extends Schema.TaggedError<OffsetOutOfRange>()("OffsetOutOfRange", {
  topic: Models.Topic,
  partition: Models.Partition,
  offset: Schema.Int,
  logStart: Models.Offset,
  highwater: Models.Offset
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `offset ${this.offset} is out of range for ${this.topic}/${this.partition} (log start ${this.logStart}, highwater ${this.highwater})`
  }
}

/** An action carried a stale epoch (fencing token) and was rejected. */
export class FencedEpoch extends Schema.TaggedError<FencedEpoch>()("FencedEpoch", {
  /** What is fenced, e.g. `"coordinator"` or a tablet key. */
  resource: Schema.String,
  current: Models.Epoch,
  attempted: Models.Epoch
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.resource}: epoch ${this.attempted} is fenced, the current epoch is ${this.current}`
  }
}

/** A state machine was asked for a transition it forbids. */
export class IllegalStateTransition extends Schema.TaggedError<IllegalStateTransition>()("IllegalStateTransition", {
  /** Which machine, e.g. `"replica"` or `"coordinator"`. */
  machine: Schema.String,
  /** The entity the machine tracks (a tablet key, a server id). */
  entity: Schema.String,
  from: Schema.String,
  to: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.machine} ${this.entity}: illegal transition ${this.from} → ${this.to}`
  }
}

/** A request reached a replica or coordinator that is not the current leader. */
export class NotLeader extends Schema.TaggedError<NotLeader>()("NotLeader", {
  resource: Schema.String,
  leader: Schema.NullOr(Models.ServerId)
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.resource}: not the leader${this.leader === null ? " (no leader known)" : ` (leader is server ${this.leader})`}`
  }
}

/**
 * Node's error codes (`error.code`) for a TLS handshake that cannot succeed as configured, so that trying again will
 * not help: a peer certificate this end does not accept (not signed by the CA given, expired, naming another host), a
 * certificate the peer required and did not get or did not accept (its alert), or a peer that does not speak TLS.
 *
 * @since 0.1.0
 */
export const TLS_REFUSAL =
  /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|UNABLE_TO_GET_ISSUER|ALTNAME|HOSTNAME_MISMATCH|ERR_SSL_WRONG_VERSION/

/**
 * An error and the errors it holds (a tagged error's `reason`, a `cause`, an `AggregateError`'s `errors`), outermost
 * first, each once, at most 6 levels deep: where a wrapped error's code or tag is looked for.
 *
 * @since 0.1.0
 */
export const causes = (error: unknown): ReadonlyArray<object> => {
  const out: Array<object> = []
  const visit = (e: unknown, depth: number) => {
    if (e === null || typeof e !== "object" || depth > 6 || out.includes(e)) return
    out.push(e)
    visit((e as { readonly reason?: unknown }).reason, depth + 1)
    const errors = (e as { readonly errors?: unknown }).errors
    if (Array.isArray(errors)) for (const inner of errors) visit(inner, depth + 1)
    visit((e as { readonly cause?: unknown }).cause, depth + 1)
  }
  visit(error, 0)
  return out
}
