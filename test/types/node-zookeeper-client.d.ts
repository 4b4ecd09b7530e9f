// Minimal types for node-zookeeper-client 1.1.3 (the package ships none): only what we call.
declare module "node-zookeeper-client" {
  import type { EventEmitter } from "node:events"

  export class Exception extends Error {
    static readonly NO_NODE: number
    static readonly NODE_EXISTS: number
    static readonly BAD_VERSION: number
    getCode(): number
    getName(): string
    getPath(): string | undefined
  }

  export class Event {
    static readonly NODE_CREATED: 1
    static readonly NODE_DELETED: 2
    static readonly NODE_DATA_CHANGED: 3
    static readonly NODE_CHILDREN_CHANGED: 4
    readonly type: number
    readonly name: string
    readonly path: string
    getType(): number
    getName(): string
    getPath(): string
  }

  export interface Stat {
    readonly version: number
    readonly ephemeralOwner: Buffer
    readonly numChildren: number
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
  }

  type Callback<A extends Array<unknown>> = (error: Exception | Error | null, ...result: A) => void
  type Watcher = (event: Event) => void

  export interface Client extends EventEmitter {
    connect(): void
    close(): void
    getSessionId(): Buffer
    create(path: string, data: Buffer | null, mode: number, callback: Callback<[path: string]>): void
    mkdirp(path: string, callback: Callback<[path: string]>): void
    remove(path: string, version: number, callback: Callback<[]>): void
    removeRecursive(path: string, version: number, callback: Callback<[]>): void
    exists(path: string, watcher: Watcher, callback: Callback<[stat: Stat | null]>): void
    exists(path: string, callback: Callback<[stat: Stat | null]>): void
    getData(path: string, watcher: Watcher, callback: Callback<[data: Buffer | null, stat: Stat]>): void
    getData(path: string, callback: Callback<[data: Buffer | null, stat: Stat]>): void
    setData(path: string, data: Buffer | null, version: number, callback: Callback<[stat: Stat]>): void
    getChildren(path: string, watcher: Watcher, callback: Callback<[children: Array<string>, stat: Stat]>): void
    getChildren(path: string, callback: Callback<[children: Array<string>, stat: Stat]>): void
  }

  export function createClient(connectionString: string, options?: ClientOptions): Client

  const zookeeper: {
    createClient: typeof createClient
    CreateMode: typeof CreateMode
    Event: typeof Event
    Exception: typeof Exception
  }
  export default zookeeper
}
