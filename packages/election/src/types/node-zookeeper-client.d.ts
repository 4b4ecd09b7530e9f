// Minimal types for node-zookeeper-client 1.1.3 (the package ships none): only what the adapter calls.
declare module "node-zookeeper-client" {
  import type { EventEmitter } from "node:events"

  export class Exception extends Error {
    static readonly OK: 0
    static readonly CONNECTION_LOSS: -4
    static readonly BAD_ARGUMENTS: -8
    static readonly NO_NODE: -101
    static readonly NO_AUTH: -102
    static readonly BAD_VERSION: -103
    static readonly NO_CHILDREN_FOR_EPHEMERALS: -108
    static readonly NODE_EXISTS: -110
    static readonly NOT_EMPTY: -111
    static readonly SESSION_EXPIRED: -112
    getCode(): number
    getName(): string
    getPath(): string | undefined
  }

  export class Event {
    static readonly NODE_CREATED: 1
    static readonly NODE_DELETED: 2
    static readonly NODE_DATA_CHANGED: 3
    static readonly NODE_CHILDREN_CHANGED: 4
    getType(): number
    getName(): string
    getPath(): string
  }

  export class State {
    static readonly DISCONNECTED: State
    static readonly SYNC_CONNECTED: State
    static readonly AUTH_FAILED: State
    static readonly CONNECTED_READ_ONLY: State
    static readonly EXPIRED: State
    readonly name: string
    readonly code: number
    getName(): string
    getCode(): number
  }

  /** ZooKeeper's stat; 64-bit fields are 8-byte big-endian buffers. */
  export interface Stat {
    readonly czxid: Buffer
    readonly mzxid: Buffer
    readonly pzxid: Buffer
    readonly version: number
    readonly cversion: number
    readonly aversion: number
    readonly ephemeralOwner: Buffer
    readonly dataLength: number
    readonly numChildren: number
  }

  /** An identity: a scheme (`world`, `digest`, `auth`, `ip`) and its id. */
  export class Id {
    constructor(scheme: string, id: string)
    readonly scheme: string
    readonly id: string
  }

  /** A node's permission bits for an identity. */
  export class ACL {
    constructor(permission: number, id: Id)
    readonly permission: number
    readonly id: Id
  }

  export const Permission: {
    readonly READ: 1
    readonly WRITE: 2
    readonly CREATE: 4
    readonly DELETE: 8
    readonly ADMIN: 16
    readonly ALL: 31
  }

  export const CreateMode: {
    readonly PERSISTENT: 0
    readonly EPHEMERAL: 1
    readonly PERSISTENT_SEQUENTIAL: 2
    readonly EPHEMERAL_SEQUENTIAL: 3
  }

  export interface ClientOptions {
    sessionTimeout?: number
    spinDelay?: number
    retries?: number
    sessionId?: Buffer
    sessionPassword?: Buffer
  }

  type Callback<A extends Array<unknown>> = (error: Exception | Error | null, ...result: A) => void
  type Watcher = (event: Event) => void

  /** One result of a committed transaction. */
  export interface TransactionResult {
    readonly type: number
    readonly path?: string
    readonly stat?: Stat
    readonly err?: number
  }

  export interface Transaction {
    /** The queued operations (1.1.3 turns a version of 0 into -1 in check/setData/remove; patched through this). */
    readonly ops: Array<{ version?: number }>
    create(path: string, data: Buffer | null, acls: Array<ACL>, mode: number): Transaction
    check(path: string, version: number): Transaction
    setData(path: string, data: Buffer | null, version: number): Transaction
    remove(path: string, version: number): Transaction
    commit(callback: Callback<[results: Array<TransactionResult>]>): void
  }

  export interface Client extends EventEmitter {
    connect(): void
    close(): void
    getState(): State
    getSessionId(): Buffer
    getSessionPassword(): Buffer
    getSessionTimeout(): number
    /**
     * Internal: the connection manager. Its socket is reset to make the client reconnect; `findNextServer` picks the
     * server each reconnect goes to, so replacing it holds reconnects back.
     */
    readonly connectionManager?: {
      readonly socket?: { destroy(): void } | null
      findNextServer(callback: (server: unknown) => void): void
    }
    /** Adds credentials to the session (sent on every connection of it); `digest` takes `user:password`. */
    addAuthInfo(scheme: string, auth: Buffer): void
    create(path: string, data: Buffer | null, mode: number, callback: Callback<[path: string]>): void
    create(path: string, data: Buffer | null, acls: Array<ACL>, mode: number, callback: Callback<[path: string]>): void
    mkdirp(path: string, callback: Callback<[path: string]>): void
    mkdirp(path: string, data: Buffer | null, acls: Array<ACL>, mode: number, callback: Callback<[path: string]>): void
    remove(path: string, version: number, callback: Callback<[]>): void
    removeRecursive(path: string, version: number, callback: Callback<[]>): void
    exists(path: string, watcher: Watcher, callback: Callback<[stat: Stat | null]>): void
    exists(path: string, callback: Callback<[stat: Stat | null]>): void
    getData(path: string, watcher: Watcher, callback: Callback<[data: Buffer | null, stat: Stat]>): void
    getData(path: string, callback: Callback<[data: Buffer | null, stat: Stat]>): void
    setData(path: string, data: Buffer | null, version: number, callback: Callback<[stat: Stat]>): void
    getChildren(path: string, watcher: Watcher, callback: Callback<[children: Array<string>, stat: Stat]>): void
    getChildren(path: string, callback: Callback<[children: Array<string>, stat: Stat]>): void
    transaction(): Transaction
  }

  export function createClient(connectionString: string, options?: ClientOptions): Client

  const zookeeper: {
    createClient: typeof createClient
    CreateMode: typeof CreateMode
    Event: typeof Event
    Exception: typeof Exception
    State: typeof State
    ACL: typeof ACL
    Id: typeof Id
    Permission: typeof Permission
  }
  export default zookeeper
}
