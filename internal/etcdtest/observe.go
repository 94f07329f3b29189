package etcdtest

import (
	"iter"
	"reflect"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// GetResponses ranges over ch, an Observe channel of etcd's
// concurrency.Election, until it closes: its elements are *GetResponse
// since etcd v3.6 and GetResponse values before (the library's go.mod
// asks for client v3.5.0), so code that must build with both takes the
// channel as it comes. A value is read field by field, not copied: it
// holds a lock in newer protobuf versions.
func GetResponses(ch any) iter.Seq[*clientv3.GetResponse] {
	return func(yield func(*clientv3.GetResponse) bool) {
		c := reflect.ValueOf(ch)
		for {
			v, ok := c.Recv()
			if !ok {
				return
			}
			var r *clientv3.GetResponse
			if v.Kind() == reflect.Pointer {
				r = v.Interface().(*clientv3.GetResponse)
			} else {
				r = &clientv3.GetResponse{
					Header: v.FieldByName("Header").Interface().(*pb.ResponseHeader),
					Kvs:    v.FieldByName("Kvs").Interface().([]*mvccpb.KeyValue),
					More:   v.FieldByName("More").Bool(),
					Count:  v.FieldByName("Count").Int(),
				}
			}
			if !yield(r) {
				return
			}
		}
	}
}
