/**
 * One campaign of the election recipe, up to its win: the server id's registration, the candidate node, the wait
 * behind the predecessor and the fencing (epoch bump, then the leader node in a transaction checking that epoch).
 * The leadership it wins is `leadership.ts`'s.
 *
 * @internal
 */
import { Coordination, Election, type Models } from "@strata/core"
import { Cause, Clock, Duration, Effect, Exit, Option, Result } from "effect"

/** The paths of a namespace's election. */
export interface Paths {
  readonly base: string
  readonly ids: string
  readonly election: string
  readonly epoch: string
  readonly leader: string
}

/** Safety checks a broken variant may switch off (tests only). */
export interface Unsafe {
  /** Write with `fenced` without checking the epoch node's version. */
  readonly skipFenceCheck?: boolean
  /** Become leader without bumping the epoch (reuse the current one). */
  readonly skipEpochBump?: boolean
  /** No deadline: `guard` and `isLeader` check only whether the leadership was lost, and `proven` never lapses. */
  readonly skipDeadline?: boolean
}

/** The highest epoch an election has seen, from any read: a bump goes past it, whatever the epoch node says now. */
export interface EpochsSeen {
  highest: number
}

/** What a campaign works with. */
export interface Context {
  readonly session: Coordination.Session
  readonly paths: Paths
  readonly candidate: Election.Candidate
  readonly epochs: EpochsSeen
  readonly unsafe: Unsafe
  /** Counts a waiting candidate woken by its predecessor's watch. */
  readonly wakeup: Effect.Effect<void>
}

/** A won election: the epoch, the epoch node's version it wrote, the leader node's data. */
export interface Won {
  readonly epoch: number
  readonly version: number
  readonly info: Models.LeaderInfo
  /** The epoch before this one (0: no leader ever was). */
  readonly previous: number
  /** When the leader registration was sent: the session was alive then. */
  readonly registeredAt: number
}

const encoder = new TextEncoder()
const decoder = new TextDecoder()
/** The UTF-8 bytes of a string. */
export const bytes = (s: string): Uint8Array => encoder.encode(s)

/** An election error naming a node whose data cannot be read. */
export const corrupt = (path: string, detail: string): Election.ElectionError =>
  new Election.ElectionError({ reason: new Election.CorruptData({ path, detail }) })

/** The epoch an epoch node holds: a whole number ≥ 0, or why it is not one. */
export const parseEpoch = (path: string, data: Uint8Array): Result.Result<number, Election.ElectionError> => {
  const text = decoder.decode(data)
  const n = /^\d+$/.test(text) ? Number(text) : Number.NaN
  return Number.isSafeInteger(n)
    ? Result.succeed(n)
    : Result.fail(
        corrupt(path, `expected a whole number of at most 16 digits, got ${JSON.stringify(text.slice(0, 40))}`)
      )
}

/** Remembers an epoch as seen. */
export const see = (epochs: EpochsSeen, epoch: number): void => {
  if (epoch > epochs.highest) epochs.highest = epoch
}

const isCode = (tag: string) => (e: Coordination.CoordinationError) => e.reason._tag === tag

/** Fails with the session's end when it ended: a campaign on it cannot go on. */
const ensureLive = (session: Coordination.Session) =>
  Effect.flatMap(session.state, (state) =>
    state === "expired"
      ? Effect.fail(Coordination.coordinationError(new Coordination.SessionExpired({ session: session.id })))
      : state === "closed"
        ? Effect.fail(Coordination.coordinationError(new Coordination.SessionClosed({ session: session.id })))
        : Effect.void
  )

/**
 * Registers `ids/<serverId>` on the campaign's session. A node there of another session is waited for, for up to
 * one and a half session timeouts (a previous incarnation's session that has not expired yet); still there after
 * that, it belongs to a live session and the registration fails with `DuplicateServerId`.
 */
export const register = (ctx: Context): Effect.Effect<void, Coordination.CoordinationError | Election.ElectionError> =>
  Effect.gen(function* () {
    const { session, candidate } = ctx
    const path = `${ctx.paths.ids}/${candidate.serverId}`
    const data = bytes(JSON.stringify(candidate))
    const giveUpAt = (yield* Clock.currentTimeMillis) + Duration.toMillis(session.timeout) * 1.5
    while (true) {
      const created = yield* session.create(path, data, { mode: "ephemeral", createParents: true }).pipe(
        Effect.as(true),
        Effect.catchIf(isCode("NodeExists"), () => Effect.succeed(false))
      )
      if (created) return
      const watch = yield* session.watchNode(path)
      if (Option.isNone(watch.value)) continue
      const owner = watch.value.value.stat.ephemeralOwner
      // A create whose reply was lost, then retried: the node is this session's already.
      if (owner === session.id) return
      const left = giveUpAt - (yield* Clock.currentTimeMillis)
      if (owner === null || left <= 0) {
        return yield* Effect.fail(
          new Election.ElectionError({
            reason: new Election.DuplicateServerId({
              serverId: candidate.serverId,
              owner: owner ?? "none (a persistent node)",
              path
            })
          })
        )
      }
      yield* Effect.logInfo(`server id ${candidate.serverId} is still registered by session ${owner}: waiting for it`)
      yield* Effect.timeoutOption(watch.changed, Duration.millis(left))
    }
  })

/** Creates this campaign's candidate node (ephemeral-sequential) and returns its path. */
const createCandidate = (ctx: Context, attempt = 0): Effect.Effect<string, Coordination.CoordinationError> =>
  ctx.session
    .create(`${ctx.paths.election}/candidate_`, bytes(String(ctx.candidate.serverId)), {
      mode: "ephemeral-sequential",
      createParents: true
    })
    .pipe(
      // Curator bug 724: the parent may vanish between creating it and the node; recreate and retry.
      Effect.catchIf(
        (e) => isCode("NoNode")(e) && attempt < 5,
        () => createCandidate(ctx, attempt + 1)
      ),
      Effect.tap((path) => Effect.logInfo(`candidate node created ${path}`))
    )

const nameOf = (path: string) => path.slice(path.lastIndexOf("/") + 1)

/** The epoch node, created at "0" when absent. */
const readEpochNode = (ctx: Context): Effect.Effect<Coordination.Node, Coordination.CoordinationError> =>
  ctx.session.get(ctx.paths.epoch).pipe(
    Effect.catchIf(isCode("NoNode"), () =>
      ctx.session.create(ctx.paths.epoch, bytes("0"), { createParents: true }).pipe(
        Effect.catchIf(isCode("NodeExists"), () => Effect.void),
        Effect.andThen(ctx.session.get(ctx.paths.epoch))
      )
    )
  )

/**
 * Bumps the epoch past every epoch seen and registers the leader node in a transaction checking the epoch node's
 * version it wrote; `undefined` when another candidate bumped it first.
 */
const fence = (ctx: Context, state: { vacantSince: number | undefined }) =>
  Effect.gen(function* () {
    const { session, paths, epochs, unsafe } = ctx
    const epochNode = yield* readEpochNode(ctx)
    const parsed = parseEpoch(paths.epoch, epochNode.data)
    if (Result.isFailure(parsed)) return yield* Effect.fail(parsed.failure)
    const previous = parsed.success
    see(epochs, previous)
    // A node deleted or reset under a running election would give a number already used: go past every one seen.
    const epoch = unsafe.skipEpochBump === true ? Math.max(previous, 1) : epochs.highest + 1
    const written =
      unsafe.skipEpochBump === true
        ? Option.some(epochNode.stat)
        : yield* session.set(paths.epoch, bytes(String(epoch)), epochNode.stat.version).pipe(
            Effect.map(Option.some),
            Effect.catchIf(isCode("BadVersion"), () => Effect.succeed(Option.none()))
          )
    if (Option.isNone(written)) return undefined
    see(epochs, epoch)
    const version = written.value.version
    const info: Models.LeaderInfo = { serverId: ctx.candidate.serverId, epoch, address: ctx.candidate.address }
    while (true) {
      const registeredAt = yield* Clock.currentTimeMillis
      const registered = yield* session
        .multi([
          Coordination.op.check(paths.epoch, version),
          Coordination.op.create(paths.leader, bytes(JSON.stringify(info)), "ephemeral")
        ])
        .pipe(
          Effect.as("ok" as const),
          Effect.catchTag("CoordinationError", (e) =>
            e.opIndex === 0
              ? Effect.succeed("fenced" as const)
              : e.opIndex === 1 && e.reason._tag === "NodeExists"
                ? Effect.succeed("stale" as const)
                : Effect.fail(e)
          )
        )
      if (registered === "ok") return { epoch, version, info, previous, registeredAt } satisfies Won
      if (registered === "fenced") return undefined
      // A leader node already there: this session's own (a registration whose reply was lost) is removed and
      // made again; another session's is waited out.
      const watch = yield* session.watchNode(paths.leader)
      if (Option.isSome(watch.value)) {
        if (watch.value.value.stat.ephemeralOwner === session.id) {
          yield* session.delete(paths.leader).pipe(Effect.catchIf(isCode("NoNode"), () => Effect.void))
        } else {
          yield* watch.changed
          state.vacantSince = yield* Clock.currentTimeMillis
        }
      }
    }
  })

/**
 * Waits until this campaign's candidate node is the lowest, then fences. The candidate knows its node by its
 * session (the node's ephemeral owner), never by a remembered name alone: when its node is gone, or its name now
 * belongs to another session (the election parent wiped and made again), it creates a new one, and it never
 * deletes a node it does not own. Safe to run again after a lost connection: `state` keeps the node and the
 * moment the leadership was seen vacant.
 */
export const elect = (
  ctx: Context,
  state: { ours: string | undefined; vacantSince: number | undefined }
): Effect.Effect<Won, Coordination.CoordinationError | Election.ElectionError> =>
  Effect.gen(function* () {
    const { session, paths } = ctx
    while (true) {
      if (state.ours === undefined) state.ours = yield* createCandidate(ctx)
      const own = yield* session.exists(state.ours)
      if (Option.isNone(own) || own.value.ephemeralOwner !== session.id) {
        yield* ensureLive(session)
        state.ours = undefined
        continue
      }
      const names = (yield* session.children(paths.election)).filter((n) => n.startsWith("candidate_")).sort()
      const index = names.indexOf(nameOf(state.ours))
      if (index < 0) continue
      if (index === 0) {
        state.vacantSince ??= yield* Clock.currentTimeMillis
        const won = yield* fence(ctx, state)
        if (won !== undefined) return won
        yield* Effect.sleep("20 millis")
        continue
      }
      const predecessor = `${paths.election}/${names[index - 1]}`
      const watch = yield* session.watchNode(predecessor)
      if (Option.isNone(watch.value)) continue
      if (watch.value.value.stat.ephemeralOwner === session.id) {
        // A node of this session's below its own (a create whose reply was lost, then retried): remove it.
        yield* session.delete(predecessor).pipe(Effect.catchIf(isCode("NoNode"), () => Effect.void))
        continue
      }
      yield* watch.changed
      yield* ctx.wakeup
      state.vacantSince = yield* Clock.currentTimeMillis
    }
  })

const FIRST_RETRY_MS = 50
const LONGEST_RETRY_MS = 1000

/**
 * Runs `self` again after a lost connection (never after an ended session), with backoff from 50 ms to 1 s, until
 * one spell of failures has lasted `budget` (then the last error). A spell ends when a run lasted longer than
 * the longest backoff, so a campaign that waits for hours survives every blip on its way.
 */
export const retryLostConnections = <A, E extends Coordination.CoordinationError | Election.ElectionError>(
  self: Effect.Effect<A, E>,
  budget: Duration.Duration
): Effect.Effect<A, E> =>
  Effect.gen(function* () {
    const budgetMs = Duration.toMillis(budget)
    let spellStart: number | undefined
    let delay = FIRST_RETRY_MS
    while (true) {
      const startedAt = yield* Clock.currentTimeMillis
      const exit = yield* Effect.exit(self)
      if (Exit.isSuccess(exit)) return exit.value
      const error = Cause.findErrorOption(exit.cause)
      if (Option.isNone(error) || !error.value.retryable) return yield* Effect.failCause(exit.cause)
      const now = yield* Clock.currentTimeMillis
      if (spellStart === undefined || now - startedAt > LONGEST_RETRY_MS * 2) {
        spellStart = now
        delay = FIRST_RETRY_MS
      }
      if (now - spellStart >= budgetMs) return yield* Effect.failCause(exit.cause)
      yield* Effect.sleep(Duration.millis(delay))
      delay = Math.min(delay * 2, LONGEST_RETRY_MS)
    }
  })
