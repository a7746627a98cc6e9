// Command grpc-go-kubelet makes gRPC calls to a kubelet plugin socket with
// grpc-go, the gRPC library kubelet itself uses, at the version Kubernetes
// v1.37.2 pins (see go.mod), so the plugin's servers are tested against a
// real grpc-go client and not only against clients written in Rust.
//
// # Dialling
//
// It dials as kubelet 1.37 does, which differs by socket:
//
//   - "registration" (kubelet's plugin watcher,
//     pkg/kubelet/pluginmanager/operationexecutor): the target is the
//     socket's path itself, so grpc-go falls back to its "passthrough"
//     resolver; a context dialer connects over "unix"; no transport
//     security; the dial blocks until the connection is up, for at most 10
//     seconds. grpc-go then sends the path, percent-encoded, as :authority
//     ("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock").
//   - "plugin" (kubelet's DRA plugin manager, pkg/kubelet/cm/dra/plugin):
//     a client for the target "unix:" + the socket's path, no transport
//     security, asked to connect at once and not at the first call.
//     grpc-go's "unix" resolver then sends "localhost" as :authority.
//     (Kubelet's metrics interceptor and stats handler change nothing on
//     the wire and are left out.)
//
// -dial picks one; by default ("auto") the first input line picks it: a
// method of /pluginregistration.Registration dials as the plugin watcher,
// any other as the DRA plugin manager. -authority overrides the
// :authority of either.
//
// # Protocol
//
// Input, one call per line: "<full method> <base64 request>". Output, one
// line per call: "ok <base64 reply>" or "err <gRPC code> <message>". All
// calls share one connection, as kubelet's calls to a plugin do.
//
// A line "stream <n> <deadline in ms> <full method> <base64 request>" opens
// a server stream (as kubelet's health watch) on the same connection and
// reads n messages within the deadline: a line "msg <base64>" each, then
// "end" once n have come (the client then cancels the stream, as kubelet
// does when it stops watching), "eof" when the server ended the stream
// first with status OK, or "err <gRPC code> <message>".
//
// # Messages, and the check with kubelet's types
//
// Requests go out as the caller's bytes, unchecked (so a test can send a
// malformed one), and the bytes of replies and stream messages are printed
// as they came: the caller encodes and decodes them with its own protobuf
// types. Both pass through a codec registered under the name of grpc-go's
// protobuf codec, so the calls carry kubelet's content-type
// ("application/grpc").
//
// That codec also decodes every reply and stream message of a method it
// knows into the Go type kubelet's own client decodes it into: the
// generated types of k8s.io/kubelet (pkg/apis/dra/v1, dra/v1beta1,
// dra-health/v1, dra-health/v1alpha1, pluginregistration/v1), with
// protobuf-go's proto.Unmarshal, as grpc-go's protobuf codec does in
// kubelet. The methods it knows are all those of the services of those
// packages; -types prints them, one line "<full method> <Go type of the
// reply>" each. When a reply does not decode, the codec fails as grpc-go's
// would, so grpc-go ends the call (or the stream) with the very status
// kubelet would get, and the output line is
//
//	err 13 grpc: failed to unmarshal the received message: <protobuf-go's error>
//
// (13 is INTERNAL) instead of "ok ..." or "msg ...". The bytes of a method
// it does not know pass unchecked.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	healthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registrationv1 "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// kubeletFiles are the proto files of the kubelet APIs a plugin serves.
var kubeletFiles = []protoreflect.FileDescriptor{
	drav1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_v1_api_proto,
	drav1beta1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_v1beta1_api_proto,
	healthv1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_health_v1_api_proto,
	healthv1alpha1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_health_v1alpha1_api_proto,
	registrationv1.File_staging_src_k8s_io_kubelet_pkg_apis_pluginregistration_v1_api_proto,
}

// registrationService is the prefix of the plugin watcher's methods.
const registrationService = "/pluginregistration.Registration/"

// replyTypes maps each full method name of kubeletFiles' services to the
// generated Go type of its reply (or stream message).
func replyTypes() (map[string]protoreflect.MessageType, error) {
	types := map[string]protoreflect.MessageType{}
	for _, file := range kubeletFiles {
		services := file.Services()
		for i := 0; i < services.Len(); i++ {
			service := services.Get(i)
			methods := service.Methods()
			for j := 0; j < methods.Len(); j++ {
				method := methods.Get(j)
				output := method.Output().FullName()
				mt, err := protoregistry.GlobalTypes.FindMessageByName(output)
				if err != nil {
					return nil, fmt.Errorf("no Go type for %s: %w", output, err)
				}
				types[fmt.Sprintf("/%s/%s", service.FullName(), method.Name())] = mt
			}
		}
	}
	return types, nil
}

// received is what a reply or stream message is received into: its bytes
// as they came, and the kubelet message it must decode into (nil when the
// method is not known).
type received struct {
	bytes []byte
	typed proto.Message
}

// newReceived is a received for a message of method.
func newReceived(types map[string]protoreflect.MessageType, method string) *received {
	r := &received{}
	if mt, ok := types[method]; ok {
		r.typed = mt.New().Interface()
	}
	return r
}

// codec sends requests as given and receives into a received.
type codec struct{}

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("grpc-go-kubelet codec: cannot send %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*received)
	if !ok {
		return fmt.Errorf("grpc-go-kubelet codec: cannot receive into %T", v)
	}
	r.bytes = data.Materialize()
	if r.typed == nil {
		return nil
	}
	return proto.Unmarshal(r.bytes, r.typed)
}

func (codec) Name() string { return "proto" }

func main() {
	authority := flag.String("authority", "", "the :authority to send (default: grpc-go's choice for kubelet's dial)")
	dial := flag.String("dial", "auto", "dial as kubelet's plugin watcher (registration), its DRA plugin manager (plugin), or by the first call (auto)")
	timeout := flag.Duration("timeout", 30*time.Second, "deadline of each call")
	listTypes := flag.Bool("types", false, "print each known method and the Go type of its reply, and exit")
	flag.Parse()

	types, err := replyTypes()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *listTypes {
		printTypes(types)
		return
	}
	if flag.NArg() != 1 || (*dial != "auto" && *dial != "registration" && *dial != "plugin") {
		fmt.Fprintln(os.Stderr, "usage: grpc-go-kubelet [-authority A] [-dial auto|registration|plugin] [-timeout D] <socket> < calls")
		fmt.Fprintln(os.Stderr, "       grpc-go-kubelet -types")
		os.Exit(2)
	}
	encoding.RegisterCodecV2(codec{})
	socket := flag.Arg(0)

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var conn *grpc.ClientConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var s *streamLine
		var method string
		var request []byte
		if strings.HasPrefix(line, "stream ") {
			if s, err = parseStreamLine(line); err != nil {
				fmt.Fprintf(os.Stderr, "bad stream line %q: %v\n", line, err)
				os.Exit(2)
			}
			method, request = s.method, s.request
		} else {
			var encoded string
			method, encoded, _ = strings.Cut(line, " ")
			if request, err = base64.StdEncoding.DecodeString(encoded); err != nil {
				fmt.Fprintf(os.Stderr, "bad request line %q: %v\n", line, err)
				os.Exit(2)
			}
		}
		if conn == nil {
			how := *dial
			if how == "auto" {
				how = "plugin"
				if strings.HasPrefix(method, registrationService) {
					how = "registration"
				}
			}
			if conn, err = connect(socket, how, *authority); err != nil {
				fmt.Fprintf(os.Stderr, "dial %s as kubelet's %s client: %v\n", socket, how, err)
				os.Exit(1)
			}
		}
		if s != nil {
			stream(out, conn, types, s)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			reply := newReceived(types, method)
			err = conn.Invoke(ctx, method, &request, reply)
			cancel()
			if err != nil {
				printStatus(out, err)
			} else {
				fmt.Fprintf(out, "ok %s\n", base64.StdEncoding.EncodeToString(reply.bytes))
			}
		}
		out.Flush()
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "reading calls: %v\n", err)
		os.Exit(1)
	}
}

// connect dials socket as kubelet's plugin watcher ("registration") or DRA
// plugin manager ("plugin") does; see the header.
func connect(socket, how, authority string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if authority != "" {
		opts = append(opts, grpc.WithAuthority(authority))
	}
	if how == "registration" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		opts = append(opts,
			grpc.WithBlock(),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", addr)
			}))
		return grpc.DialContext(ctx, socket, opts...)
	}
	conn, err := grpc.NewClient("unix:"+socket, opts...)
	if err != nil {
		return nil, err
	}
	conn.Connect()
	return conn, nil
}

// printTypes writes "<full method> <Go type of the reply>", sorted.
func printTypes(types map[string]protoreflect.MessageType) {
	methods := make([]string, 0, len(types))
	for m := range types {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	for _, m := range methods {
		t := reflect.TypeOf(types[m].Zero().Interface()).Elem()
		fmt.Printf("%s %s.%s\n", m, t.PkgPath(), t.Name())
	}
}

// printStatus writes a call's error as "err <gRPC code> <message>".
func printStatus(out *bufio.Writer, err error) {
	s := status.Convert(err)
	fmt.Fprintf(out, "err %d %s\n", s.Code(), strings.ReplaceAll(s.Message(), "\n", " "))
}

// streamLine is a parsed "stream" input line.
type streamLine struct {
	n        int
	deadline time.Duration
	method   string
	request  []byte
}

// parseStreamLine parses "stream <n> <ms> <method> <base64 request>"
// (the request may be left out when empty).
func parseStreamLine(line string) (*streamLine, error) {
	fields := strings.SplitN(line, " ", 5)
	if len(fields) == 4 {
		fields = append(fields, "")
	}
	if len(fields) != 5 {
		return nil, errors.New("want stream <n> <deadline in ms> <method> <base64 request>")
	}
	n, err := strconv.Atoi(fields[1])
	if err != nil || n < 0 {
		return nil, fmt.Errorf("bad message count %q", fields[1])
	}
	ms, err := strconv.Atoi(fields[2])
	if err != nil || ms <= 0 {
		return nil, fmt.Errorf("bad deadline %q", fields[2])
	}
	request, err := base64.StdEncoding.DecodeString(fields[4])
	if err != nil {
		return nil, err
	}
	return &streamLine{n: n, deadline: time.Duration(ms) * time.Millisecond, method: fields[3], request: request}, nil
}

// stream reads s.n messages of a server stream of s.method within
// s.deadline.
func stream(out *bufio.Writer, conn *grpc.ClientConn, types map[string]protoreflect.MessageType, s *streamLine) {
	ctx, cancel := context.WithTimeout(context.Background(), s.deadline)
	defer cancel()
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, s.method)
	if err == nil {
		err = cs.SendMsg(&s.request)
	}
	if err == nil {
		err = cs.CloseSend()
	}
	for i := 0; err == nil && i < s.n; i++ {
		message := newReceived(types, s.method)
		if err = cs.RecvMsg(message); err == nil {
			fmt.Fprintf(out, "msg %s\n", base64.StdEncoding.EncodeToString(message.bytes))
		}
	}
	switch {
	case err == nil:
		fmt.Fprintln(out, "end")
	case err == io.EOF:
		fmt.Fprintln(out, "eof")
	default:
		printStatus(out, err)
	}
}
