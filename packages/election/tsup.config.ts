import { packageConfig } from "../../tsup.shared.js"

export default packageConfig(["src/index.ts", "src/ZooKeeperCoordination.ts", "src/EtcdCoordination.ts"], {
  external: ["node-zookeeper-client", "etcd3"]
})
