// Command etcd is etcd's own server main, built from the module so the local cluster gets a current etcd.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
