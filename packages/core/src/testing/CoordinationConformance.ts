/**
 * The `Coordination` conformance suite: the contract every coordination
 * adapter (memory, ZooKeeper, etcd) must pass.
 *
 * It runs on real time, so it works against real servers: every test works
 * under its own root node (`/conformance-<time>-<random>`) that it deletes
 * afterwards, every wait for an event is bounded, and every "nothing happens"
 * check lasts only `quietPeriod` (300 ms by default).
 *
 * ```ts
 * import { Coordination, MemoryCoordination } from "@strata/core"
 * import { CoordinationConformance } from "@strata/core/testing"
 *
 * CoordinationConformance.suite("memory", MemoryCoordination.layer())
 * ```
 *
 * @since 0.1.0
 */
import * as Coordination from "../Coordination.js"
import { assert, layer } from "@effect/vitest"
import type { Duration as DurationNs } from "effect"
import { Clock, Duration, Effect, Exit, Fiber, Option, Random, Result, Scope, Stream } from "effect"
import type { Layer } from "effect"

/** Options of the conformance suite. */
export interface SuiteOptions {
  /** Upper bound of every wait for an expected event or state (default 5 seconds). */
  readonly eventTimeout?: DurationNs.Input
  /** How long "nothing happens" is observed (default 300 millis; keep it short). */
  readonly quietPeriod?: DurationNs.Input
  /** Timeout the suite's sessions ask for (default 10 seconds). */
  readonly sessionTimeout?: DurationNs.Input
  /** Vitest timeout of each test (default 30 seconds; a number is milliseconds). */
  readonly testTimeout?: DurationNs.Input
  /** Timeout of building and releasing the layer (default 60 seconds). */
  readonly layerTimeout?: DurationNs.Input
}

type ReasonTag = Coordination.ErrorReason["_tag"]

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const bytes = (s: string): Uint8Array => encoder.encode(s)
const text = (b: Uint8Array): string => decoder.decode(b)
const empty = new Uint8Array(0)

const sequenceOf = (name: string, prefix: string): number => {
  assert.match(name, new RegExp(`^${prefix}\\d{10}$`), `${name} is ${prefix} followed by 10 digits`)
  return Number(name.slice(prefix.length))
}

const nameOf = (path: string): string => path.slice(path.lastIndexOf("/") + 1)

/** Deletes a subtree, ignoring whatever is already gone. */
const removeTree = (session: Coordination.Session, path: string): Effect.Effect<void> =>
  Effect.gen(function* () {
    const children = yield* session.children(path).pipe(Effect.orElseSucceed((): ReadonlyArray<string> => []))
    for (const child of children) yield* removeTree(session, `${path}/${child}`)
    yield* session.delete(path).pipe(Effect.ignore)
  })

/** The running suite's knobs and fixtures, resolved once per test. */
const makeFixture = (options: SuiteOptions | undefined) => {
  const eventTimeout = Duration.fromInputUnsafe(options?.eventTimeout ?? "5 seconds")
  const quietPeriod = Duration.fromInputUnsafe(options?.quietPeriod ?? "300 millis")
  const sessionTimeout = options?.sessionTimeout ?? "10 seconds"

  /** Fails the test unless `self` completes within the event timeout. */
  const within = <A, E, R>(self: Effect.Effect<A, E, R>, what: string): Effect.Effect<A, E, R> =>
    Effect.flatMap(
      Effect.timeoutOption(self, eventTimeout),
      Option.match({
        onNone: () => Effect.die(new Error(`timed out after ${Duration.format(eventTimeout)} waiting for ${what}`)),
        onSome: Effect.succeed
      })
    )

  /** The first event of a watch, within the event timeout. */
  const fired = (
    watch: Coordination.Watch<unknown>,
    what: string
  ): Effect.Effect<Coordination.WatchEvent, Coordination.CoordinationError> => within(watch.changed, what)

  /** Asserts that a watch neither fires nor fails for the quiet period. */
  const quiet = (watch: Coordination.Watch<unknown>, what: string): Effect.Effect<void> =>
    Effect.gen(function* () {
      const outcome = yield* Effect.timeoutOption(Effect.exit(watch.changed), quietPeriod)
      if (Option.isSome(outcome)) {
        assert.fail(
          `${what}: expected no event, got ${JSON.stringify(Exit.isSuccess(outcome.value) ? outcome.value.value : String(outcome.value.cause))}`
        )
      }
    })

  /** Asserts that `self` fails with a `CoordinationError` of the given reason. */
  const failsWith = <A>(self: Effect.Effect<A, Coordination.CoordinationError>, tag: ReasonTag, what: string = tag) =>
    Effect.gen(function* () {
      const result = yield* Effect.result(self)
      if (Result.isSuccess(result)) return assert.fail(`${what}: expected ${tag}, but it succeeded`)
      const error = result.failure
      assert.strictEqual(error._tag, "CoordinationError", what)
      assert.strictEqual(error.reason._tag, tag, `${what}: ${error.message}`)
      return error
    })

  /** Polls until the predicate holds, within the event timeout. */
  const eventually = <A, E>(self: Effect.Effect<A, E>, predicate: (a: A) => boolean, what: string) =>
    within(
      Effect.gen(function* () {
        while (true) {
          const a = yield* self
          if (predicate(a)) return a
          yield* Effect.sleep("20 millis")
        }
      }),
      what
    )

  const setup = Effect.gen(function* () {
    const coordination = yield* Coordination.Coordination
    const faults = yield* Coordination.Faults
    const open = (sessionOptions?: Coordination.SessionOptions) =>
      coordination.session({ timeout: sessionTimeout, ...sessionOptions })
    /** Opens a session in a child scope of the test that can be closed early. */
    const openClosable = Effect.gen(function* () {
      const scope = yield* Scope.fork(yield* Effect.scope)
      const session = yield* open().pipe(Scope.provide(scope))
      return { session, close: Scope.close(scope, Exit.void) } as const
    })
    const admin = yield* open()
    const millis = yield* Clock.currentTimeMillis
    const random = yield* Random.nextIntBetween(0, 2 ** 31 - 1)
    const root = `/conformance-${millis.toString(36)}-${random.toString(36)}`
    yield* admin.create(root, empty)
    // Registered after `admin`, so it runs before `admin` closes and after every later session closed.
    yield* Effect.addFinalizer(() => removeTree(admin, root))
    const at = (...names: ReadonlyArray<string>) => [root, ...names].join("/")
    return { coordination, faults, admin, root, at, open, openClosable } as const
  })

  return { eventTimeout, within, fired, quiet, failsWith, eventually, setup } as const
}

/**
 * Registers the conformance suite for a coordination adapter. The layer is
 * built once for the whole suite; the tests run on real time.
 */
export const suite = (
  name: string,
  coordinationLayer: Layer.Layer<Coordination.Coordination | Coordination.Faults, unknown>,
  options?: SuiteOptions
): void => {
  const { eventTimeout, failsWith, fired, quiet, eventually, setup, within } = makeFixture(options)
  const testTimeout = Duration.toMillis(Duration.fromInputUnsafe(options?.testTimeout ?? "30 seconds"))

  layer(coordinationLayer, { excludeTestServices: true, timeout: options?.layerTimeout ?? "60 seconds" })(
    `Coordination conformance: ${name}`,
    (it) => {
      const test = (
        title: string,
        body: () => Effect.Effect<void, unknown, Coordination.Coordination | Coordination.Faults | Scope.Scope>
      ) => it.effect(title, body, testTimeout)

      // ---------------------------------------------------------------------
      // Nodes
      // ---------------------------------------------------------------------

      test("create, get, exists, set and delete a persistent node", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const p = at("node")
          assert.strictEqual(yield* s.create(p, bytes("v0")), p)
          const n0 = yield* s.get(p)
          assert.strictEqual(text(n0.data), "v0")
          assert.strictEqual(n0.stat.version, 0)
          assert.strictEqual(n0.stat.childrenVersion, 0)
          assert.strictEqual(n0.stat.ephemeralOwner, null)
          const e0 = yield* s.exists(p)
          assert.isTrue(Option.isSome(e0))
          assert.deepStrictEqual(Option.getOrThrow(e0), n0.stat)

          const st1 = yield* s.set(p, bytes("v1"))
          assert.strictEqual(st1.version, 1)
          assert.strictEqual(st1.createdOrder, n0.stat.createdOrder)
          assert.isTrue(st1.modifiedOrder > n0.stat.modifiedOrder, "modifiedOrder grows on set")
          const n1 = yield* s.get(p)
          assert.strictEqual(text(n1.data), "v1")
          assert.deepStrictEqual(n1.stat, st1)

          yield* s.delete(p)
          assert.isTrue(Option.isNone(yield* s.exists(p)))
          const error = yield* failsWith(s.get(p), "NoNode")
          assert.strictEqual((error.reason as { path: string }).path, p)
        }))

      test("the root exists and a new node has no children", () =>
        Effect.gen(function* () {
          const { admin: s, root } = yield* setup
          assert.isTrue(Option.isSome(yield* s.exists("/")))
          assert.deepStrictEqual(yield* s.children(root), [])
          assert.isTrue((yield* s.children("/")).includes(nameOf(root)))
        }))

      test("createdOrder and modifiedOrder are store-wide and follow the order of writes", () =>
        Effect.gen(function* () {
          const { admin: s, at, open } = yield* setup
          const other = yield* open()
          yield* s.create(at("a"), empty)
          yield* s.create(at("b"), empty)
          const a0 = (yield* s.get(at("a"))).stat
          const b0 = (yield* s.get(at("b"))).stat
          assert.isTrue(b0.createdOrder > a0.createdOrder, "later creation has a larger createdOrder")
          assert.strictEqual(a0.modifiedOrder, a0.createdOrder, "a new node was last modified at its creation")
          const a1 = yield* other.set(at("a"), bytes("x"))
          assert.isTrue(a1.modifiedOrder > b0.createdOrder, "a later write by another session orders after")
          yield* other.create(at("c"), empty)
          const c = (yield* s.get(at("c"))).stat
          assert.isTrue(c.createdOrder > a1.modifiedOrder)
          assert.strictEqual((yield* s.get(at("a"))).stat.createdOrder, a0.createdOrder, "set keeps createdOrder")
        }))

      test("data round-trips arbitrary bytes and is copied on write", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const raw = new Uint8Array([0, 255, 1, 128, 0, 10, 13, 0xc3, 0x28])
          yield* s.create(at("bin"), raw)
          raw[0] = 42
          assert.deepStrictEqual(Array.from((yield* s.get(at("bin"))).data), [0, 255, 1, 128, 0, 10, 13, 0xc3, 0x28])
          yield* s.create(at("empty"), empty)
          assert.strictEqual((yield* s.get(at("empty"))).data.length, 0)
          yield* s.set(at("bin"), empty)
          assert.strictEqual((yield* s.get(at("bin"))).data.length, 0)
        }))

      test("children are the sorted names of the direct children", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          yield* s.create(at("p"), empty)
          for (const child of ["b", "c", "a-1", "a"]) yield* s.create(at("p", child), empty)
          yield* s.create(at("p", "b", "grandchild"), empty)
          assert.deepStrictEqual(yield* s.children(at("p")), ["a", "a-1", "b", "c"])
          assert.deepStrictEqual(yield* s.children(at("p", "c")), [])
        }))

      test("versions: data version +1 per set, childrenVersion +1 per child created or deleted", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const p = at("p")
          yield* s.create(p, empty)
          yield* s.create(at("p", "c1"), empty)
          yield* s.create(at("p", "c2"), empty)
          let parent = (yield* s.get(p)).stat
          assert.strictEqual(parent.childrenVersion, 2)
          assert.strictEqual(parent.version, 0, "children do not change the data version")
          yield* s.set(at("p", "c1"), bytes("1"))
          const c1 = yield* s.set(at("p", "c1"), bytes("2"), 1)
          assert.strictEqual(c1.version, 2)
          assert.strictEqual(
            (yield* s.get(p)).stat.childrenVersion,
            2,
            "a child's data does not change childrenVersion"
          )
          yield* s.delete(at("p", "c2"))
          parent = (yield* s.get(p)).stat
          assert.strictEqual(parent.childrenVersion, 3)
          const set = yield* s.set(p, bytes("p"), 0)
          assert.strictEqual(set.version, 1)
          assert.strictEqual(set.childrenVersion, 3, "set keeps childrenVersion")
        }))

      test("createParents creates missing ancestors as persistent nodes with empty data", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const leaf = at("a", "b", "c")
          assert.strictEqual(yield* s.create(leaf, bytes("leaf"), { mode: "ephemeral", createParents: true }), leaf)
          for (const ancestor of [at("a"), at("a", "b")]) {
            const n = yield* s.get(ancestor)
            assert.strictEqual(n.data.length, 0, `${ancestor} has empty data`)
            assert.strictEqual(n.stat.ephemeralOwner, null, `${ancestor} is persistent`)
          }
          const n = yield* s.get(leaf)
          assert.strictEqual(text(n.data), "leaf")
          assert.strictEqual(n.stat.ephemeralOwner, s.id)
          // existing parents are fine, an existing node is not
          yield* s.create(at("a", "d"), empty, { createParents: true })
          yield* failsWith(s.create(leaf, empty, { createParents: true }), "NodeExists")
          // sequential under new parents
          const seq = yield* s.create(at("x", "y", "item-"), empty, {
            mode: "persistent-sequential",
            createParents: true
          })
          assert.strictEqual(seq.slice(0, at("x", "y").length), at("x", "y"))
          sequenceOf(nameOf(seq), "item-")
          // without createParents the parent must exist
          yield* failsWith(s.create(at("m", "n"), empty), "NoNode")
          assert.isTrue(Option.isNone(yield* s.exists(at("m"))), "a failed create leaves no parent behind")
        }))

      // ---------------------------------------------------------------------
      // Error reasons
      // ---------------------------------------------------------------------

      test("NoNode for a missing node or a missing parent", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const missing = at("missing")
          yield* failsWith(s.get(missing), "NoNode", "get")
          yield* failsWith(s.set(missing, empty), "NoNode", "set")
          yield* failsWith(s.set(missing, empty, 0), "NoNode", "versioned set")
          yield* failsWith(s.delete(missing), "NoNode", "delete")
          yield* failsWith(s.delete(missing, 0), "NoNode", "versioned delete")
          yield* failsWith(s.children(missing), "NoNode", "children")
          yield* failsWith(s.watchChildren(missing), "NoNode", "watchChildren")
          yield* failsWith(s.multi([Coordination.op.check(missing, 0)]), "NoNode", "multi check")
          yield* failsWith(s.create(at("missing", "child"), empty), "NoNode", "create under a missing parent")
          yield* failsWith(
            s.create(at("missing", "child-"), empty, { mode: "ephemeral-sequential" }),
            "NoNode",
            "sequential create under a missing parent"
          )
          assert.isTrue(Option.isNone(yield* s.exists(missing)))
        }))

      test("NodeExists when the node is already there", () =>
        Effect.gen(function* () {
          const { admin: s, at, open } = yield* setup
          yield* s.create(at("x"), bytes("first"))
          yield* failsWith(s.create(at("x"), bytes("second")), "NodeExists")
          const other = yield* open()
          yield* failsWith(
            other.create(at("x"), empty, { mode: "ephemeral" }),
            "NodeExists",
            "ephemeral over persistent"
          )
          const n = yield* s.get(at("x"))
          assert.strictEqual(text(n.data), "first")
          assert.strictEqual(n.stat.ephemeralOwner, null)
        }))

      test("BadVersion for a stale versioned set, delete or check, which changes nothing", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const p = at("x")
          yield* s.create(p, bytes("0"))
          yield* s.set(p, bytes("1"), 0)
          const error = yield* failsWith(s.set(p, bytes("stale"), 0), "BadVersion", "stale set")
          assert.strictEqual(error.opIndex, undefined, "a single operation has no opIndex")
          yield* failsWith(s.set(p, bytes("future"), 5), "BadVersion", "future set")
          yield* failsWith(s.delete(p, 0), "BadVersion", "stale delete")
          yield* failsWith(s.multi([Coordination.op.check(p, 0)]), "BadVersion", "stale check")
          const n = yield* s.get(p)
          assert.strictEqual(text(n.data), "1")
          assert.strictEqual(n.stat.version, 1)
          yield* s.multi([Coordination.op.check(p, 1)])
          yield* s.delete(p, 1)
          assert.isTrue(Option.isNone(yield* s.exists(p)))
        }))

      test("NotEmpty when deleting a node that has children", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          yield* s.create(at("p"), empty)
          yield* s.create(at("p", "c"), empty)
          yield* failsWith(s.delete(at("p")), "NotEmpty")
          yield* failsWith(s.delete(at("p"), 0), "NotEmpty", "versioned delete")
          assert.isTrue(Option.isSome(yield* s.exists(at("p", "c"))))
          yield* s.delete(at("p", "c"))
          yield* s.delete(at("p"))
          assert.isTrue(Option.isNone(yield* s.exists(at("p"))))
        }))

      test("NoChildrenForEphemerals under an ephemeral node", () =>
        Effect.gen(function* () {
          const { admin: s, at, open } = yield* setup
          yield* s.create(at("e"), empty, { mode: "ephemeral" })
          yield* failsWith(s.create(at("e", "c"), empty), "NoChildrenForEphemerals", "persistent child")
          yield* failsWith(
            s.create(at("e", "c"), empty, { mode: "ephemeral" }),
            "NoChildrenForEphemerals",
            "ephemeral child"
          )
          yield* failsWith(
            s.create(at("e", "c-"), empty, { mode: "persistent-sequential" }),
            "NoChildrenForEphemerals",
            "sequential child"
          )
          yield* failsWith(
            s.create(at("e", "c", "d"), empty, { createParents: true }),
            "NoChildrenForEphemerals",
            "createParents under an ephemeral node"
          )
          const other = yield* open()
          yield* failsWith(other.create(at("e", "c"), empty), "NoChildrenForEphemerals", "from another session")
          assert.deepStrictEqual(yield* s.children(at("e")), [])
        }))

      test("InvalidPath for relative paths, empty or dot segments and trailing slashes", () =>
        Effect.gen(function* () {
          const { admin: s, root } = yield* setup
          const invalid = [
            "",
            "relative",
            "relative/child",
            `${root}/`,
            `${root}//x`,
            `${root}/./x`,
            `${root}/../x`,
            `${root}/x/.`,
            `${root}/x/..`,
            "//",
            `${root}/a\u0000b`
          ]
          for (const p of invalid) {
            const what = (name: string) => `${name}(${JSON.stringify(p)})`
            yield* failsWith(s.create(p, empty), "InvalidPath", what("create"))
            yield* failsWith(s.create(p, empty, { createParents: true }), "InvalidPath", what("create with parents"))
            yield* failsWith(s.get(p), "InvalidPath", what("get"))
            yield* failsWith(s.exists(p), "InvalidPath", what("exists"))
            yield* failsWith(s.set(p, empty), "InvalidPath", what("set"))
            yield* failsWith(s.delete(p), "InvalidPath", what("delete"))
            yield* failsWith(s.children(p), "InvalidPath", what("children"))
            yield* failsWith(s.watchNode(p), "InvalidPath", what("watchNode"))
            yield* failsWith(s.watchChildren(p), "InvalidPath", what("watchChildren"))
            yield* failsWith(s.multi([Coordination.op.create(p, empty)]), "InvalidPath", what("multi create"))
          }
          assert.deepStrictEqual(yield* s.children(root), [], "nothing was created")
          // names may contain dots
          yield* s.create(`${root}/.hidden`, empty)
          yield* s.create(`${root}/a..b`, empty)
          assert.deepStrictEqual(yield* s.children(root), [".hidden", "a..b"])
        }))

      // ---------------------------------------------------------------------
      // Sequential nodes
      // ---------------------------------------------------------------------

      test("sequential names end in 10 digits that increase per parent", () =>
        Effect.gen(function* () {
          const { admin: s, at, open } = yield* setup
          const q = at("q")
          yield* s.create(q, empty)
          const created: Array<string> = []
          for (let i = 0; i < 3; i++)
            created.push(yield* s.create(`${q}/item-`, bytes(`${i}`), { mode: "persistent-sequential" }))
          const numbers = created.map((p) => {
            assert.strictEqual(p.slice(0, q.length + 1), `${q}/`)
            return sequenceOf(nameOf(p), "item-")
          })
          for (let i = 1; i < numbers.length; i++) assert.isTrue(numbers[i]! > numbers[i - 1]!, "increasing")
          for (const [i, p] of created.entries()) assert.strictEqual(text((yield* s.get(p)).data), `${i}`)
          // a delete does not make a number come back
          yield* s.delete(created[2]!)
          const after = sequenceOf(
            nameOf(yield* s.create(`${q}/item-`, empty, { mode: "persistent-sequential" })),
            "item-"
          )
          assert.isTrue(after > numbers[2]!, "no reuse after a delete")
          // the counter belongs to the parent, whatever the prefix and the session
          const other = yield* open()
          const otherPath = yield* other.create(`${q}/other-`, empty, { mode: "ephemeral-sequential" })
          assert.isTrue(sequenceOf(nameOf(otherPath), "other-") > after, "shared per parent")
          assert.strictEqual(Option.getOrThrow(yield* s.exists(otherPath)).ephemeralOwner, other.id)
          // another parent counts on its own and does not clash
          yield* s.create(at("r"), empty)
          const r = yield* s.create(`${at("r")}/item-`, empty, { mode: "persistent-sequential" })
          sequenceOf(nameOf(r), "item-")
          yield* failsWith(s.create(created[0]!, empty), "NodeExists", "a sequential node's path is taken")
        }))

      test("ephemeral-sequential candidates sort by name in creation order", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const election = at("election")
          yield* admin.create(election, empty)
          const sessions = [yield* open(), yield* open(), yield* open()]
          const order = [0, 1, 2, 0, 1, 2, 1]
          const created: Array<readonly [string, Coordination.Session]> = []
          for (const i of order) {
            const session = sessions[i]!
            created.push([
              yield* session.create(`${election}/candidate_`, bytes(`${i}`), { mode: "ephemeral-sequential" }),
              session
            ])
          }
          assert.deepStrictEqual(
            yield* admin.children(election),
            created.map(([p]) => nameOf(p))
          )
          for (const [p, session] of created) {
            assert.strictEqual(Option.getOrThrow(yield* admin.exists(p)).ephemeralOwner, session.id)
          }
        }))

      // ---------------------------------------------------------------------
      // multi
      // ---------------------------------------------------------------------

      test("multi applies every operation in order and returns their results", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const a = at("a")
          const results = yield* s.multi([
            Coordination.op.create(a, bytes("1")),
            Coordination.op.create(at("seq-"), empty, "persistent-sequential"),
            Coordination.op.set(a, bytes("2"), 0),
            Coordination.op.check(a, 1),
            Coordination.op.create(at("a", "child"), empty),
            Coordination.op.delete(at("a", "child")),
            Coordination.op.create(at("e"), empty, "ephemeral")
          ])
          assert.deepStrictEqual(
            results.map((r) => r._tag),
            ["create", "create", "set", "check", "create", "delete", "create"]
          )
          const path = (r: Coordination.OpResult | undefined) =>
            r?._tag === "create" ? r.path : assert.fail("not a create result")
          assert.strictEqual(path(results[0]), a)
          sequenceOf(nameOf(path(results[1])), "seq-")
          assert.isTrue(Option.isSome(yield* s.exists(path(results[1]))))
          const set = results[2]
          assert.strictEqual(set?._tag === "set" ? set.stat.version : -1, 1)
          const n = yield* s.get(a)
          assert.strictEqual(text(n.data), "2")
          assert.strictEqual(n.stat.version, 1)
          assert.strictEqual(n.stat.childrenVersion, 2)
          assert.deepStrictEqual(yield* s.children(a), [])
          assert.strictEqual(Option.getOrThrow(yield* s.exists(at("e"))).ephemeralOwner, s.id)
          assert.deepStrictEqual(yield* s.multi([]), [], "an empty multi succeeds")
        }))

      test("multi is all or nothing: a failing check at the end leaves no trace", () =>
        Effect.gen(function* () {
          const { admin: s, at, root } = yield* setup
          yield* s.create(at("x"), bytes("x"))
          yield* s.create(at("y"), bytes("y"))
          const before = yield* s.get(root)
          const childrenBefore = yield* s.children(root)
          const error = yield* failsWith(
            s.multi([
              Coordination.op.create(at("m1"), bytes("m1")),
              Coordination.op.create(at("m1", "m2"), empty),
              Coordination.op.create(at("s-"), empty, "persistent-sequential"),
              Coordination.op.set(at("x"), bytes("changed")),
              Coordination.op.delete(at("y")),
              Coordination.op.check(at("x"), 7)
            ]),
            "BadVersion"
          )
          assert.strictEqual(error.opIndex, 5)
          assert.isTrue(Option.isNone(yield* s.exists(at("m1"))), "no created node")
          assert.deepStrictEqual(yield* s.children(root), childrenBefore)
          const x = yield* s.get(at("x"))
          assert.strictEqual(text(x.data), "x")
          assert.strictEqual(x.stat.version, 0)
          assert.isTrue(Option.isSome(yield* s.exists(at("y"))), "no deleted node")
          const after = yield* s.get(root)
          assert.strictEqual(after.stat.childrenVersion, before.stat.childrenVersion)
          assert.strictEqual(after.stat.version, before.stat.version)
        }))

      test("multi names the failing operation's reason and index", () =>
        Effect.gen(function* () {
          const { admin: s, at, root } = yield* setup
          yield* s.create(at("x"), empty)
          const cases: ReadonlyArray<
            readonly [string, ReadonlyArray<Parameters<Coordination.Session["multi"]>[0][number]>, ReasonTag, number]
          > = [
            [
              "create over an existing node",
              [Coordination.op.create(at("n1"), empty), Coordination.op.create(at("x"), empty)],
              "NodeExists",
              1
            ],
            [
              "delete of a missing node",
              [Coordination.op.check(at("x"), 0), Coordination.op.delete(at("missing"))],
              "NoNode",
              1
            ],
            ["set of a missing node", [Coordination.op.set(at("missing"), empty)], "NoNode", 0],
            [
              "create under a missing parent",
              [Coordination.op.create(at("n1"), empty), Coordination.op.create(at("nope", "c"), empty)],
              "NoNode",
              1
            ],
            [
              "delete of a node given a child earlier in the same multi",
              [
                Coordination.op.create(at("p"), empty),
                Coordination.op.create(at("p", "c"), empty),
                Coordination.op.delete(at("p"))
              ],
              "NotEmpty",
              2
            ],
            [
              "child of an ephemeral node created earlier in the same multi",
              [Coordination.op.create(at("e"), empty, "ephemeral"), Coordination.op.create(at("e", "c"), empty)],
              "NoChildrenForEphemerals",
              1
            ],
            ["stale versioned set", [Coordination.op.set(at("x"), empty, 5)], "BadVersion", 0],
            [
              "stale versioned delete",
              [Coordination.op.check(at("x"), 0), Coordination.op.delete(at("x"), 3)],
              "BadVersion",
              1
            ]
          ]
          for (const [what, ops, tag, index] of cases) {
            const error = yield* failsWith(s.multi(ops), tag, what)
            assert.strictEqual(error.opIndex, index, `${what}: opIndex`)
            assert.deepStrictEqual(yield* s.children(root), ["x"], `${what}: nothing applied`)
          }
          // operations see the effects of earlier ones in the same multi
          yield* s.multi([
            Coordination.op.create(at("p"), empty),
            Coordination.op.create(at("p", "c"), empty),
            Coordination.op.delete(at("p", "c")),
            Coordination.op.delete(at("p"))
          ])
          assert.deepStrictEqual(yield* s.children(root), ["x"])
        }))

      test("check + set multi is a fencing write: a stale epoch is rejected", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const epoch = at("epoch")
          const state = at("state")
          yield* admin.create(epoch, bytes("0"))
          yield* admin.create(state, bytes("initial"))
          const a = yield* open()
          const b = yield* open()
          // both believe the epoch is at version 0; a bumps it first
          const seenByB = Option.getOrThrow(yield* b.exists(epoch)).version
          const bumped = yield* a.set(epoch, bytes("1"), 0)
          const error = yield* failsWith(
            b.multi([Coordination.op.check(epoch, seenByB), Coordination.op.set(state, bytes("from b"))]),
            "BadVersion"
          )
          assert.strictEqual(error.opIndex, 0)
          assert.strictEqual(text((yield* admin.get(state)).data), "initial", "the stale write left no trace")
          yield* a.multi([Coordination.op.check(epoch, bumped.version), Coordination.op.set(state, bytes("from a"))])
          assert.strictEqual(text((yield* admin.get(state)).data), "from a")
          // two racing bumps of the same version: exactly one wins
          const outcomes = yield* Effect.all(
            [a.set(epoch, bytes("2a"), bumped.version), b.set(epoch, bytes("2b"), bumped.version)].map(Effect.result),
            { concurrency: "unbounded" }
          )
          assert.strictEqual(outcomes.filter(Result.isSuccess).length, 1, "exactly one CAS wins")
          for (const o of outcomes) {
            if (Result.isFailure(o)) assert.strictEqual(o.failure.reason._tag, "BadVersion")
          }
          assert.strictEqual((yield* admin.get(epoch)).stat.version, 2)
        }))

      // ---------------------------------------------------------------------
      // Sessions
      // ---------------------------------------------------------------------

      test("a new session is connected, with its own id and a positive timeout", () =>
        Effect.gen(function* () {
          const { coordination, admin, open } = yield* setup
          const other = yield* open()
          assert.isString(coordination.backend)
          assert.isTrue(coordination.backend.length > 0)
          assert.strictEqual(yield* other.state, "connected")
          assert.isTrue(other.id.length > 0)
          assert.notStrictEqual(other.id, admin.id)
          assert.isTrue(Duration.toMillis(other.timeout) > 0)
        }))

      test("an ephemeral node vanishes when its session's scope closes; other sessions' watches fire", () =>
        Effect.gen(function* () {
          const { admin, at, root, openClosable } = yield* setup
          const { session: s, close } = yield* openClosable
          const e = at("e")
          yield* s.create(e, bytes("mine"), { mode: "ephemeral" })
          const seq = yield* s.create(at("candidate_"), empty, { mode: "ephemeral-sequential" })
          yield* s.create(at("kept"), empty)
          assert.strictEqual(Option.getOrThrow(yield* admin.exists(e)).ephemeralOwner, s.id)
          const nodeWatch = yield* admin.watchNode(e)
          assert.strictEqual(text(Option.getOrThrow(nodeWatch.value).data), "mine")
          const childWatch = yield* admin.watchChildren(root)
          const states = yield* s.changes.pipe(Stream.runCollect, Effect.timeoutOption(eventTimeout), Effect.forkChild)
          yield* Effect.sleep("50 millis")

          yield* close
          assert.deepStrictEqual(yield* fired(nodeWatch, "NodeDeleted"), { _tag: "NodeDeleted", path: e })
          assert.deepStrictEqual(yield* fired(childWatch, "NodeChildrenChanged"), {
            _tag: "NodeChildrenChanged",
            path: root
          })
          assert.isTrue(Option.isNone(yield* admin.exists(e)))
          assert.isTrue(Option.isNone(yield* admin.exists(seq)))
          assert.isTrue(Option.isSome(yield* admin.exists(at("kept"))), "persistent nodes stay")
          assert.strictEqual(yield* s.state, "closed")
          const seen = yield* Fiber.join(states)
          assert.isTrue(Option.isSome(seen), "changes ends after closed")
          assert.strictEqual(Option.getOrThrow(seen).at(-1), "closed")
        }))

      test("an ephemeral node vanishes when its session expires; other sessions' watches fire NodeDeleted", () =>
        Effect.gen(function* () {
          const { admin, at, faults, open } = yield* setup
          const s = yield* open()
          const bystander = yield* open()
          const e = at("e")
          yield* s.create(e, empty, { mode: "ephemeral" })
          const seq = yield* s.create(at("candidate_"), empty, { mode: "ephemeral-sequential" })
          const survivor = yield* bystander.create(at("survivor"), empty, { mode: "ephemeral" })
          const fromAdmin = yield* admin.watchNode(e)
          const fromBystander = yield* bystander.watchNode(seq)
          const survivorWatch = yield* admin.watchNode(survivor)

          yield* faults.expire(s)
          assert.deepStrictEqual(yield* fired(fromAdmin, "NodeDeleted"), { _tag: "NodeDeleted", path: e })
          assert.deepStrictEqual(yield* fired(fromBystander, "NodeDeleted"), { _tag: "NodeDeleted", path: seq })
          assert.isTrue(Option.isNone(yield* admin.exists(e)))
          assert.isTrue(Option.isNone(yield* admin.exists(seq)))
          yield* eventually(s.state, (state) => state === "expired", "the session's state to become expired")
          // other sessions are untouched
          assert.strictEqual(yield* bystander.state, "connected")
          assert.strictEqual(Option.getOrThrow(yield* admin.exists(survivor)).ephemeralOwner, bystander.id)
          yield* quiet(survivorWatch, "another session's ephemeral node")
        }))

      test("operations after expiry fail with SessionExpired", () =>
        Effect.gen(function* () {
          const { admin, at, faults, open } = yield* setup
          const s = yield* open()
          yield* admin.create(at("x"), empty)
          yield* faults.expire(s)
          yield* eventually(s.state, (state) => state === "expired", "the session's state to become expired")
          yield* failsWith(s.create(at("y"), empty), "SessionExpired", "create")
          yield* failsWith(s.get(at("x")), "SessionExpired", "get")
          yield* failsWith(s.exists(at("x")), "SessionExpired", "exists")
          yield* failsWith(s.set(at("x"), bytes("nope")), "SessionExpired", "set")
          yield* failsWith(s.delete(at("x")), "SessionExpired", "delete")
          yield* failsWith(s.children(at("x")), "SessionExpired", "children")
          yield* failsWith(s.multi([Coordination.op.check(at("x"), 0)]), "SessionExpired", "multi")
          yield* failsWith(s.watchNode(at("x")), "SessionExpired", "watchNode")
          yield* failsWith(s.watchChildren(at("x")), "SessionExpired", "watchChildren")
          const x = yield* admin.get(at("x"))
          assert.strictEqual(x.stat.version, 0)
          assert.isTrue(Option.isNone(yield* admin.exists(at("y"))))
          assert.strictEqual(yield* s.state, "expired", "expired is final")
        }))

      test("operations after close fail with SessionClosed", () =>
        Effect.gen(function* () {
          const { admin, at, openClosable } = yield* setup
          const { session: s, close } = yield* openClosable
          yield* admin.create(at("x"), empty)
          yield* close
          assert.strictEqual(yield* s.state, "closed")
          yield* failsWith(s.create(at("y"), empty), "SessionClosed", "create")
          yield* failsWith(s.get(at("x")), "SessionClosed", "get")
          yield* failsWith(s.exists(at("x")), "SessionClosed", "exists")
          yield* failsWith(s.set(at("x"), bytes("nope")), "SessionClosed", "set")
          yield* failsWith(s.delete(at("x")), "SessionClosed", "delete")
          yield* failsWith(s.children(at("x")), "SessionClosed", "children")
          yield* failsWith(s.multi([Coordination.op.check(at("x"), 0)]), "SessionClosed", "multi")
          yield* failsWith(s.watchNode(at("x")), "SessionClosed", "watchNode")
          yield* failsWith(s.watchChildren(at("x")), "SessionClosed", "watchChildren")
          assert.isTrue(Option.isSome(yield* admin.exists(at("x"))))
          assert.isTrue(Option.isNone(yield* admin.exists(at("y"))))
        }))

      test("pending watches of an expired session fail with SessionExpired", () =>
        Effect.gen(function* () {
          const { admin, at, root, faults, open } = yield* setup
          const s = yield* open()
          yield* admin.create(at("x"), empty)
          const nodeWatch = yield* s.watchNode(at("x"))
          const missingWatch = yield* s.watchNode(at("missing"))
          const childWatch = yield* s.watchChildren(root)
          yield* faults.expire(s)
          for (const [what, watch] of [
            ["watchNode", nodeWatch],
            ["watchNode (missing)", missingWatch],
            ["watchChildren", childWatch]
          ] as const) {
            const exit = yield* within(Effect.exit(watch.changed), `${what} to fail`)
            assert.isTrue(Exit.isFailure(exit), `${what} fails`)
            yield* failsWith(watch.changed, "SessionExpired", what)
          }
          // a later change does not turn them into events
          yield* admin.set(at("x"), bytes("later"))
          yield* failsWith(nodeWatch.changed, "SessionExpired", "watchNode after a later change")
        }))

      test("pending watches of a closed session fail with SessionClosed", () =>
        Effect.gen(function* () {
          const { admin, at, root, openClosable } = yield* setup
          const { session: s, close } = yield* openClosable
          yield* admin.create(at("x"), empty)
          const nodeWatch = yield* s.watchNode(at("x"))
          const childWatch = yield* s.watchChildren(root)
          yield* close
          for (const [what, watch] of [
            ["watchNode", nodeWatch],
            ["watchChildren", childWatch]
          ] as const) {
            yield* within(Effect.exit(watch.changed), `${what} to fail`)
            yield* failsWith(watch.changed, "SessionClosed", what)
          }
        }))

      test("changes reports expired, then ends", () =>
        Effect.gen(function* () {
          const { faults, open } = yield* setup
          const s = yield* open()
          const states = yield* s.changes.pipe(Stream.runCollect, Effect.forkChild)
          yield* Effect.sleep("50 millis")
          // Expiring a real session takes a while (ZooKeeper: a twin client closes it): the bound starts once it did.
          yield* faults.expire(s)
          const seen = yield* Fiber.join(states).pipe(Effect.timeoutOption(eventTimeout))
          assert.isTrue(Option.isSome(seen), "changes ends after expired")
          const list: ReadonlyArray<Coordination.SessionState> = Option.getOrThrow(seen)
          assert.strictEqual(list.at(-1), "expired")
          assert.isFalse(list.includes("closed"))
          assert.strictEqual(yield* s.state, "expired")
        }))

      // ---------------------------------------------------------------------
      // Watches
      // ---------------------------------------------------------------------

      test("watchNode on a missing node reads none and fires NodeCreated once", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("x")
          const watch = yield* admin.watchNode(p)
          assert.isTrue(Option.isNone(watch.value))
          yield* other.create(p, bytes("hello"))
          const event = yield* fired(watch, "NodeCreated")
          assert.deepStrictEqual(event, { _tag: "NodeCreated", path: p })
          yield* other.set(p, bytes("again"))
          yield* other.delete(p)
          assert.deepStrictEqual(yield* fired(watch, "the same event"), event, "a used watch does not fire again")
        }))

      test("watchNode fires NodeDataChanged for the first change only", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("x")
          yield* admin.create(p, bytes("v0"))
          const watch = yield* admin.watchNode(p)
          const read: Coordination.Node = Option.getOrThrow(watch.value)
          assert.strictEqual(text(read.data), "v0")
          assert.strictEqual(read.stat.version, 0)
          yield* other.set(p, bytes("v1"))
          yield* other.set(p, bytes("v2"))
          yield* other.delete(p)
          assert.deepStrictEqual(yield* fired(watch, "NodeDataChanged"), { _tag: "NodeDataChanged", path: p })
          assert.deepStrictEqual(yield* fired(watch, "the same event"), { _tag: "NodeDataChanged", path: p })
          // a fresh watch sees the state after those changes
          const fresh = yield* admin.watchNode(p)
          assert.isTrue(Option.isNone(fresh.value))
          yield* quiet(fresh, "no change since the read")
        }))

      test("watchNode fires NodeDeleted", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("x")
          yield* admin.create(p, empty)
          const watch = yield* admin.watchNode(p)
          yield* other.delete(p)
          assert.deepStrictEqual(yield* fired(watch, "NodeDeleted"), { _tag: "NodeDeleted", path: p })
        }))

      test("a session's own change fires its own watch", () =>
        Effect.gen(function* () {
          const { admin: s, at } = yield* setup
          const p = at("x")
          yield* s.create(p, empty)
          const watch = yield* s.watchNode(p)
          yield* s.set(p, bytes("own"))
          assert.deepStrictEqual(yield* fired(watch, "NodeDataChanged"), { _tag: "NodeDataChanged", path: p })
        }))

      test("watchNode ignores changes before the read, child changes and other nodes", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("x")
          yield* admin.create(p, empty)
          yield* admin.create(at("sibling"), empty)
          yield* other.set(p, bytes("before"))
          const watch = yield* admin.watchNode(p)
          assert.strictEqual(text(Option.getOrThrow(watch.value).data), "before")
          yield* other.create(at("x", "child"), empty)
          yield* other.set(at("x", "child"), bytes("c"))
          yield* other.set(at("sibling"), bytes("s"))
          yield* other.delete(at("sibling"))
          yield* quiet(watch, "watchNode after child and sibling changes")
        }))

      test("watchChildren fires NodeChildrenChanged when a child is created", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("p")
          yield* admin.create(p, empty)
          yield* admin.create(at("p", "a"), empty)
          const watch = yield* admin.watchChildren(p)
          assert.deepStrictEqual(watch.value, ["a"])
          yield* other.create(at("p", "b"), empty, { mode: "ephemeral" })
          assert.deepStrictEqual(yield* fired(watch, "NodeChildrenChanged"), { _tag: "NodeChildrenChanged", path: p })
          assert.deepStrictEqual(yield* admin.children(p), ["a", "b"])
        }))

      test("watchChildren fires NodeChildrenChanged when a child is deleted", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("p")
          yield* admin.create(p, empty)
          yield* admin.create(at("p", "a"), empty)
          const watch = yield* admin.watchChildren(p)
          yield* other.delete(at("p", "a"))
          assert.deepStrictEqual(yield* fired(watch, "NodeChildrenChanged"), { _tag: "NodeChildrenChanged", path: p })
        }))

      test("watchChildren fires NodeDeleted when the node itself is deleted", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("p")
          yield* admin.create(p, empty)
          const watch = yield* admin.watchChildren(p)
          assert.deepStrictEqual(watch.value, [])
          yield* other.delete(p)
          assert.deepStrictEqual(yield* fired(watch, "NodeDeleted"), { _tag: "NodeDeleted", path: p })
        }))

      test("watchChildren ignores data changes and grandchildren", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("p")
          yield* admin.create(p, empty)
          yield* admin.create(at("p", "a"), empty)
          const watch = yield* admin.watchChildren(p)
          yield* other.set(p, bytes("data"))
          yield* other.set(at("p", "a"), bytes("data"))
          yield* other.create(at("p", "a", "grandchild"), empty)
          yield* quiet(watch, "watchChildren after data and grandchild changes")
        }))

      test("every watch on a node fires once, in every session", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const other = yield* open()
          const p = at("x")
          yield* admin.create(p, empty)
          const watches = [yield* admin.watchNode(p), yield* admin.watchNode(p), yield* other.watchNode(p)]
          yield* other.set(p, bytes("1"))
          for (const [i, watch] of watches.entries()) {
            assert.deepStrictEqual(yield* fired(watch, `watch ${i}`), { _tag: "NodeDataChanged", path: p })
          }
        }))

      test("a candidate watching its predecessor wakes alone when the predecessor's session expires", () =>
        Effect.gen(function* () {
          const { admin, at, faults, open } = yield* setup
          const election = at("election")
          yield* admin.create(election, empty)
          const sessions = [yield* open(), yield* open(), yield* open()]
          const candidates: Array<string> = []
          for (const session of sessions) {
            candidates.push(yield* session.create(`${election}/candidate_`, empty, { mode: "ephemeral-sequential" }))
          }
          const second = yield* sessions[1]!.watchNode(candidates[0]!)
          const third = yield* sessions[2]!.watchNode(candidates[1]!)
          yield* faults.expire(sessions[0]!)
          assert.deepStrictEqual(yield* fired(second, "the predecessor's NodeDeleted"), {
            _tag: "NodeDeleted",
            path: candidates[0]!
          })
          yield* quiet(third, "the third candidate")
          assert.deepStrictEqual(yield* admin.children(election), candidates.slice(1).map(nameOf))
        }))

      test("watches fire only after a successful multi, with its changes visible", () =>
        Effect.gen(function* () {
          const { admin, at, root, open } = yield* setup
          const other = yield* open()
          const x = at("x")
          yield* admin.create(x, bytes("old"))
          const nodeWatch = yield* admin.watchNode(x)
          const childWatch = yield* admin.watchChildren(root)
          const missingWatch = yield* admin.watchNode(at("n1"))
          yield* failsWith(
            other.multi([
              Coordination.op.set(x, bytes("new")),
              Coordination.op.create(at("n1"), empty),
              Coordination.op.check(x, 99)
            ]),
            "BadVersion",
            "failing multi"
          )
          yield* quiet(nodeWatch, "watchNode after a failed multi")
          yield* quiet(childWatch, "watchChildren after a failed multi")
          yield* quiet(missingWatch, "watchNode of a node a failed multi would have created")
          yield* other.multi([
            Coordination.op.set(x, bytes("new")),
            Coordination.op.create(at("n1"), empty),
            Coordination.op.create(at("n2"), empty)
          ])
          assert.deepStrictEqual(yield* fired(nodeWatch, "NodeDataChanged"), { _tag: "NodeDataChanged", path: x })
          assert.deepStrictEqual(yield* fired(childWatch, "NodeChildrenChanged"), {
            _tag: "NodeChildrenChanged",
            path: root
          })
          assert.deepStrictEqual(yield* fired(missingWatch, "NodeCreated"), { _tag: "NodeCreated", path: at("n1") })
          assert.strictEqual(text((yield* admin.get(x)).data), "new")
          assert.deepStrictEqual(yield* admin.children(root), ["n1", "n2", "x"])
        }))

      test("a read and its watch are atomic: no change between them is missed", () =>
        Effect.gen(function* () {
          const { admin, at, open } = yield* setup
          const writer = yield* open()
          const p = at("x")
          const writes = 25
          yield* admin.create(p, bytes("0"))
          const writing = yield* Effect.forkChild(
            Effect.forEach(
              Array.from({ length: writes }, (_, i) => i + 1),
              (i) => writer.set(p, bytes(`${i}`)).pipe(Effect.andThen(Effect.yieldNow)),
              { discard: true }
            )
          )
          let watches = 0
          while (true) {
            const watch = yield* admin.watchNode(p)
            watches++
            const node = Option.getOrThrow(watch.value)
            assert.strictEqual(text(node.data), `${node.stat.version}`, "data and version of one read agree")
            if (node.stat.version === writes) {
              yield* Fiber.join(writing)
              yield* quiet(watch, "the watch after the last write")
              break
            }
            const event = yield* fired(watch, `a change after version ${node.stat.version}`)
            assert.deepStrictEqual(event, { _tag: "NodeDataChanged", path: p })
            assert.isTrue((yield* admin.get(p)).stat.version > node.stat.version, "the event is for a later change")
          }
          assert.isTrue(watches >= 1)
        }))
    }
  )
}

/**
 * The suspension tests, for a backend whose `CoordinationFaults` can cut a session's connection
 * (`disconnect` / `reconnect`): the memory backend natively, a real server through a proxy a test can stall. A
 * backend without them does not run this suite (rather than passing it vacuously).
 */
export const suspensionSuite = (
  name: string,
  coordinationLayer: Layer.Layer<Coordination.Coordination | Coordination.Faults, unknown>,
  options?: SuiteOptions
): void => {
  const { eventually, failsWith, quiet, setup } = makeFixture(options)
  const testTimeout = Duration.toMillis(Duration.fromInputUnsafe(options?.testTimeout ?? "30 seconds"))
  layer(coordinationLayer, { excludeTestServices: true, timeout: options?.layerTimeout ?? "60 seconds" })(
    `Coordination conformance, suspension: ${name}`,
    (it) => {
      const test = (
        title: string,
        body: () => Effect.Effect<void, unknown, Coordination.Coordination | Coordination.Faults | Scope.Scope>
      ) => it.effect(title, body, testTimeout)

      test("a suspended session fails with retryable ConnectionLoss and keeps its ephemeral nodes if it reconnects in time", () =>
        Effect.gen(function* () {
          const { admin, at, faults, open } = yield* setup
          const { disconnect, reconnect } = faults
          if (disconnect === undefined || reconnect === undefined) {
            return assert.fail("a backend run by the suspension suite must provide disconnect and reconnect")
          }
          const s = yield* open()
          const e = at("e")
          yield* s.create(e, empty, { mode: "ephemeral" })
          const watch = yield* admin.watchNode(e)
          yield* disconnect(s)
          yield* eventually(s.state, (state) => state === "suspended", "the session's state to become suspended")
          const error = yield* failsWith(s.get(e), "ConnectionLoss")
          assert.isTrue(error.retryable)
          assert.isTrue(Option.isSome(yield* admin.exists(e)), "the server keeps the ephemeral node")
          yield* reconnect(s)
          yield* eventually(s.state, (state) => state === "connected", "the session's state to become connected")
          const n = yield* s.get(e)
          assert.strictEqual(n.stat.ephemeralOwner, s.id)
          yield* quiet(watch, "the ephemeral node of a session that reconnected in time")
        }))
    }
  )
}
