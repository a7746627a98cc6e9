// Command grpc-go-kubelet makes unary gRPC calls to a kubelet plugin socket
// with grpc-go, the gRPC library kubelet itself uses, so the plugin's
// servers are tested against a real grpc-go client and not only against
// clients written in Rust.
//
// It dials like kubelet does: the target is the socket's path, reached
// through a context dialer over "unix", without transport security. So
// grpc-go picks the :authority header itself (the path, for the grpc-go
// versions that predate kubelet's "localhost"), unless -authority sets one.
//
// The messages stay opaque bytes: a codec that passes them through is
// registered under the name of grpc-go's protobuf codec, so the calls carry
// the same content-type ("application/grpc") as kubelet's, and the caller
// encodes requests and decodes replies with its own protobuf types.
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
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// opaque is a codec that sends and receives message bytes as they are.
type opaque struct{}

func (opaque) Marshal(v interface{}) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("opaque codec: cannot send %T", v)
	}
	return *b, nil
}

func (opaque) Unmarshal(data []byte, v interface{}) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("opaque codec: cannot receive into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (opaque) Name() string { return "proto" }

func main() {
	encoding.RegisterCodec(opaque{})
	authority := flag.String("authority", "", "the :authority to send (default: grpc-go's choice)")
	timeout := flag.Duration("timeout", 30*time.Second, "deadline of each call")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: grpc-go-kubelet [-authority A] [-timeout D] <socket> < calls")
		os.Exit(2)
	}
	socket := flag.Arg(0)
	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithContextDialer(func(ctx context.Context, target string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", target)
		}),
	}
	if *authority != "" {
		opts = append(opts, grpc.WithAuthority(*authority))
	}
	conn, err := grpc.Dial(socket, opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", socket, err)
		os.Exit(1)
	}
	defer conn.Close()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "stream ") {
			fields := strings.SplitN(line, " ", 5)
			if len(fields) == 4 {
				fields = append(fields, "")
			}
			var n, ms int
			var err error
			if len(fields) == 5 {
				n, err = strconv.Atoi(fields[1])
				if err == nil {
					ms, err = strconv.Atoi(fields[2])
				}
			}
			request, err2 := decodeRequest(fields[len(fields)-1])
			if len(fields) != 5 || err != nil || err2 != nil || n < 0 || ms <= 0 {
				fmt.Fprintf(os.Stderr, "bad stream line %q\n", line)
				os.Exit(2)
			}
			stream(out, conn, time.Duration(ms)*time.Millisecond, n, fields[3], request)
			out.Flush()
			continue
		}
		method, encoded, found := strings.Cut(line, " ")
		if !found {
			encoded = ""
		}
		request, err := decodeRequest(encoded)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad request line %q: %v\n", line, err)
			os.Exit(2)
		}
		var reply []byte
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		err = conn.Invoke(ctx, method, &request, &reply)
		cancel()
		if err != nil {
			printStatus(out, err)
		} else {
			fmt.Fprintf(out, "ok %s\n", base64.StdEncoding.EncodeToString(reply))
		}
		out.Flush()
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "reading calls: %v\n", err)
		os.Exit(1)
	}
}

func decodeRequest(encoded string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(encoded)
}

// printStatus writes a call's error as "err <gRPC code> <message>".
func printStatus(out *bufio.Writer, err error) {
	s := status.Convert(err)
	fmt.Fprintf(out, "err %d %s\n", s.Code(), strings.ReplaceAll(s.Message(), "\n", " "))
}

// stream reads n messages of a server stream of method within deadline.
func stream(out *bufio.Writer, conn *grpc.ClientConn, deadline time.Duration, n int, method string, request []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err == nil {
		err = s.SendMsg(&request)
	}
	if err == nil {
		err = s.CloseSend()
	}
	for i := 0; err == nil && i < n; i++ {
		var reply []byte
		if err = s.RecvMsg(&reply); err == nil {
			fmt.Fprintf(out, "msg %s\n", base64.StdEncoding.EncodeToString(reply))
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
