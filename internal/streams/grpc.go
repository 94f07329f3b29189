package streams

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// requireLeaderMD is the metadata of clientv3.WithRequireLeader, made once
// and shared: never written.
var requireLeaderMD = metadata.Pairs(rpctypes.MetadataRequireLeaderKey, rpctypes.MetadataHasLeader)

// RequireLeader is clientv3.WithRequireLeader(ctx), without its
// allocation of the metadata when ctx carries none of its own: a waiter
// keeps its context, and this one less, for as long as it waits.
func RequireLeader(ctx context.Context) context.Context {
	if _, ok := metadata.FromOutgoingContext(ctx); ok {
		return clientv3.WithRequireLeader(ctx)
	}
	return metadata.NewOutgoingContext(ctx, requireLeaderMD)
}

// TransientCode reports whether err carries the gRPC code of an etcd
// error a later attempt may not meet: no leader, leader changed, etcd's
// own request timeouts, too many requests. Judging by the code rather
// than a list keeps errors of newer etcd releases covered.
func TransientCode(err error) bool {
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return true
	}
	return false
}
