"""An S3-compatible server for the S3 tests (tests/io/s3_spec.lua): moto's server mode on 127.0.0.1, run by
the test venv's Python (third_party/test-venv.sh).

    python s3_server.py READY_FILE BUCKET DIR

moto checks SigV4 signatures only once INITIAL_NO_AUTH_ACTION_COUNT requests have been made, so this
makes exactly that many without credentials, through moto's IAM: a user, a policy allowing S3, and the
user's access key. Every request after that is signed and checked: the bucket is created and DIR's files
uploaded (keys: their paths below DIR) with that key. Then it writes READY_FILE (JSON: port, key id,
secret) and serves until it is killed.
"""
import json
import os
import socket
import sys
import threading

BOOTSTRAP_ACTIONS = 3  # CreateUser, PutUserPolicy, CreateAccessKey
os.environ['INITIAL_NO_AUTH_ACTION_COUNT'] = str(BOOTSTRAP_ACTIONS)  # read when moto is imported

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

REGION = 'us-east-1'
POLICY = {'Version': '2012-10-17', 'Statement': [{'Effect': 'Allow', 'Action': 's3:*', 'Resource': '*'}]}


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def main():
    ready_file, bucket, root = sys.argv[1], sys.argv[2], sys.argv[3]
    port = free_port()
    server = ThreadedMotoServer(ip_address='127.0.0.1', port=port, verbose=False)
    server.start()
    endpoint = 'http://127.0.0.1:%d' % port
    iam = boto3.client('iam', endpoint_url=endpoint, region_name=REGION, aws_access_key_id='bootstrap',
                       aws_secret_access_key='bootstrap')
    iam.create_user(UserName='wick')
    iam.put_user_policy(UserName='wick', PolicyName='s3', PolicyDocument=json.dumps(POLICY))
    key = iam.create_access_key(UserName='wick')['AccessKey']
    s3 = boto3.client('s3', endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key['AccessKeyId'],
                      aws_secret_access_key=key['SecretAccessKey'])
    s3.create_bucket(Bucket=bucket)
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(directory, name)
            s3.upload_file(path, bucket, os.path.relpath(path, root))
    with open(ready_file + '.tmp', 'w') as f:
        json.dump({'port': port, 'key': key['AccessKeyId'], 'secret': key['SecretAccessKey']}, f)
    os.rename(ready_file + '.tmp', ready_file)
    threading.Event().wait()


if __name__ == '__main__':
    main()
